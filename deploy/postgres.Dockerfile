# PostgreSQL from Debian's own package, for the compose stack where the postgres image cannot be pulled
# (docker-compose.local.yml): what the official image's entrypoint does that the stack uses, POSTGRES_USER /
# POSTGRES_PASSWORD / POSTGRES_DB on the first start of an empty data volume, password (SCRAM) authentication
# for every TCP client. Built by `docker-compose -f docker-compose.yml -f docker-compose.local.yml build`.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o postgres -g postgres /var/lib/postgresql/data /var/run/postgresql
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data
USER postgres
EXPOSE 5432
# a fast shutdown (SIGINT): the default SIGTERM waits for every client to leave, past docker stop's 10 s
STOPSIGNAL SIGINT
ENTRYPOINT ["postgres-entrypoint"]
