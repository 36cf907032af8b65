# jetcrew-worker: `jetcrew worker` in an image of its own.
#
# Built from scratch by build-images.sh, which stages the context: jetcrew
# and jetcrew-bridge are the static binaries of `make build` (bin/), nothing
# else. The worker starts run containers through the Docker engine of the
# host (its socket is mounted in), so every path it hands to the engine must
# be the same path on the host:
#   - the state dir (per-run directory with the bridge socket) is under
#     $TMPDIR, which the compose file points at a host directory mounted at
#     the same path;
#   - the bridge binary is /opt/jetcrew/bin/jetcrew-bridge, beside the
#     executable; the compose file mounts the host's copy, at that same path,
#     over the image's.
# The agent's run containers never get the socket; see docs/deploy.md.
FROM scratch
COPY jetcrew jetcrew-bridge /opt/jetcrew/bin/
ENV PATH=/opt/jetcrew/bin TMPDIR=/var/lib/jetcrew
USER 65532:65532
EXPOSE 9464
# `jetcrew worker` stops on SIGTERM: runs in flight get --drain-timeout.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/opt/jetcrew/bin/jetcrew"]
CMD ["worker", "--metrics-addr", "0.0.0.0:9464"]
