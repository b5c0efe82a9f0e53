# Redis from Debian's redis-server package, for machines that cannot pull redis:7.4.6 (no
# registry): the compose test builds it on its local base and runs compose with
#   BRORL_REDIS_IMAGE=brorl-local/redis:bookworm
# Users keep the public redis image (docker-compose.yml's default). Bookworm's Redis is 7.0: the
# Streams, consumer groups, XAUTOCLAIM and Lua that brorl uses are all there.
#   docker build -f docker/redis.Dockerfile --build-arg BASE_IMAGE=... -t brorl-local/redis:bookworm .
ARG BASE_IMAGE=debian:12.12-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /data && chown redis:redis /data \
 && printf '%s\n' '#!/bin/sh' \
      '# As the public image: options alone go to redis-server, which listens on every interface.' \
      'if [ "${1#-}" != "$1" ]; then set -- redis-server "$@"; fi' \
      'if [ "$1" = redis-server ]; then shift; exec redis-server --protected-mode no --bind "* -::*" --dir /data "$@"; fi' \
      'exec "$@"' > /usr/local/bin/redis-entrypoint \
 && chmod 755 /usr/local/bin/redis-entrypoint
WORKDIR /data
USER redis
EXPOSE 6379
ENTRYPOINT ["/usr/local/bin/redis-entrypoint"]
CMD ["redis-server"]
