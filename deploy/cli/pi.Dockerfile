# An image for jetcrew's `pi` backend. Build it where a registry is
# reachable (jetcrew never pulls at run time):
#
#   docker build -f deploy/cli/pi.Dockerfile -t jetcrew-pi:latest .
#
# and name it in a profile: [profiles.pi] backend = "pi", image = "jetcrew-pi:latest".
# The worker runs it as 65532:65532 with a read-only root, HOME=/home/agent and
# /tmp as tmpfs, the bridge at /opt/jetcrew/bridge and /run/jetcrew mounted
# read-only; the CLI must be on PATH as `pi`.
FROM node:22-slim
# pi needs Node.js 22.19 or newer; it does not start on Node 20.
RUN npm install -g @earendil-works/pi-coding-agent && npm cache clean --force
RUN groupadd -g 65532 agent && useradd -u 65532 -g 65532 -d /home/agent -s /usr/sbin/nologin agent \
 && install -d -o 65532 -g 65532 -m 0700 /home/agent
USER 65532:65532
WORKDIR /home/agent
