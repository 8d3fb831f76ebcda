#!/bin/sh
# Start Redis with the per-role ACL users of users.acl: comments are dropped and the
# ${ROLE_REDIS_PASSWORD} placeholders filled in from the environment (passwords: letters and
# digits only, as .env.example says). The rendered file lives in the container's /tmp only.
set -eu
acl=/tmp/users.acl
cp /etc/baton/users.acl "$acl.in"
sed -i -e '/^#/d' -e '/^[[:space:]]*$/d' "$acl.in"
for role in ADMIN RELAY BRAIN HANDS CLIENT OPERATOR; do
  eval "secret=\${${role}_REDIS_PASSWORD:?set ${role}_REDIS_PASSWORD}"
  sed -i "s|\${${role}_REDIS_PASSWORD}|${secret}|g" "$acl.in"
done
mv "$acl.in" "$acl"
chmod 600 "$acl"
exec redis-server /etc/baton/redis.conf --aclfile "$acl" "$@"
