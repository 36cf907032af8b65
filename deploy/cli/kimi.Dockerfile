# An image for jetcrew's `kimi` backend. Build it where a registry is
# reachable (jetcrew never pulls at run time):
#
#   docker build -f deploy/cli/kimi.Dockerfile -t jetcrew-kimi:latest .
#
# and name it in a profile: [profiles.kimi] backend = "kimi", image = "jetcrew-kimi:latest".
# The worker runs it as 65532:65532 with a read-only root, HOME=/home/agent and
# /tmp as tmpfs, the bridge at /opt/jetcrew/bridge and /run/jetcrew mounted
# read-only; the CLI must be on PATH as `kimi`.
FROM python:3.13-slim
RUN pip install --no-cache-dir kimi-cli
RUN groupadd -g 65532 agent && useradd -u 65532 -g 65532 -d /home/agent -s /usr/sbin/nologin agent \
 && install -d -o 65532 -g 65532 -m 0700 /home/agent
USER 65532:65532
WORKDIR /home/agent
