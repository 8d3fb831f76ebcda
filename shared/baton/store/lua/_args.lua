--[==[ _args.lua: checks of numeric arguments, placed before every script (see scripts.py).

tonumber takes "nan", "inf", "1e400" and fractions. A script that used such an argument as it
came failed (or stored it, to fail a later script) after its first write: a lease TTL used
after the receipt and the fence increment, a "nan" TTL stored by a renewal that then
quarantined the session. Every script checks each numeric argument here before any write and
refuses the call with INVALID, writing nothing.
]==]
-- The largest duration in ms an argument may give (about three years), and the largest
-- fence, count or limit (integers stay exact in a Lua number below 2^53).
local MAX_MS, MAX_INT = 100000000000, 9007199254740991

-- An integer argument in [lo, hi] (a fence, a count, a duration in ms), else nil.
local function int_in(v, lo, hi)
  local n = tonumber(v)
  if n == nil or n ~= n or n % 1 ~= 0 or n < lo or n > hi then return nil end
  return n
end

-- Each of {name, value, lo, hi} checked with int_in: the INVALID reply of the first one
-- refused, else nil.
local function bad_args(checks)
  for _, c in ipairs(checks) do
    if int_in(c[2], c[3], c[4]) == nil then
      return redis.error_reply('INVALID ' .. c[1] .. ' must be an integer from '
        .. string.format('%.0f', c[3]) .. ' to ' .. string.format('%.0f', c[4]) .. ', not '
        .. tostring(c[2]))
    end
  end
  return nil
end
