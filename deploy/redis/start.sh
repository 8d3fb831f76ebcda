#!/bin/sh
# Start Redis with the per-role ACL users of users.acl: comments are dropped and the
# ${ROLE_REDIS_PASSWORD} placeholders filled in from the environment (passwords: letters and
# digits only, as .env.example says). awk takes each password from its own environment
# (ENVIRON), never from its command line: any user of the host may read every process's
# arguments (ps, /proc/<pid>/cmdline), not its environment. The rendered file is created
# 0600 (umask) in the container's /tmp only.
set -eu
template=${BATON_ACL_TEMPLATE:-/etc/baton/users.acl}
conf=${BATON_REDIS_CONF:-/etc/baton/redis.conf}
acl=${BATON_ACL_FILE:-/tmp/users.acl}
for role in ADMIN RELAY BRAIN HANDS CLIENT OPERATOR; do
  eval ": \"\${${role}_REDIS_PASSWORD:?set ${role}_REDIS_PASSWORD}\""
done
umask 077
awk '
  /^#/ || /^[[:space:]]*$/ { next }
  {
    line = $0; out = ""
    while (match(line, /\$\{[A-Z]+_REDIS_PASSWORD\}/)) {
      name = substr(line, RSTART + 2, RLENGTH - 3)
      if (!(name in ENVIRON)) { print "start.sh: " name " is not set" > "/dev/stderr"; exit 1 }
      out = out substr(line, 1, RSTART - 1) ENVIRON[name]
      line = substr(line, RSTART + RLENGTH)
    }
    print out line
  }' "$template" > "$acl.in"
mv "$acl.in" "$acl"
exec redis-server "$conf" --aclfile "$acl" "$@"
