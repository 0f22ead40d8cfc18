# One image for both roles: the coordinator (`xclp-server ...`) and a party (`xclp-client ...`).
#
#   normal:   docker build -t xclp .                      (pip installs from the package index)
#   offline:  scripts/docker-prepare                       (base image xclp-base:bookworm from Debian
#             packages, a wheelhouse in its cache, then: docker build --build-arg WHEELHOUSE=1
#             --build-arg BASE_IMAGE=xclp-base:bookworm -t xclp:dev on a copy of the sources)
#
# The base must be Debian bookworm with python3 (3.11) and its venv module: the official
# python:3.11-slim-bookworm (python at /usr/local/bin) or xclp-base:bookworm, which
# scripts/docker-prepare imports from debootstrap under a name of its own (python at /usr/bin).
# Everything below goes through `python3 -m venv`, so both work.
#
# Two stages: the builder holds the wheelhouse, pip's build backends and the sources; the final
# stage gets only the finished virtualenv, so none of those (nor any file of the build context)
# ships in the image.

ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS builder
# Lets scripts/docker-prepare find and remove the untagged builder images of earlier builds.
LABEL io.xclp.build-stage=builder
# 1 = install only from the wheels in the build context's wheelhouse/ (no network).
ARG WHEELHOUSE=0
# Optional extras of pyproject.toml installed too: dask (--workers tls://scheduler:8786, and the
# `dask scheduler` / `dask worker` commands of an institution's own cluster, docs/cluster.md).
ARG EXTRAS="dask"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN python3 -m venv /opt/xclp/venv

# Dependencies first, in their own layer, so editing the sources does not reinstall numpy & co.
# The bracket glob lets this COPY match no wheelhouse at all (normal mode): it then copies only
# pyproject.toml. .dockerignore keeps xclp's own wheel out, the package is built from source below.
COPY pyproject.toml wheelhous[e] /build/
RUN set -eu; \
    if [ "$WHEELHOUSE" = 1 ]; then \
        if ! ls /build/*.whl >/dev/null 2>&1; then \
            echo "WHEELHOUSE=1 but the build context has no wheelhouse/*.whl: run scripts/docker-prepare first" >&2; \
            exit 1; \
        fi; \
        export PIP_NO_INDEX=1 PIP_FIND_LINKS=/build; \
    fi; \
    EXTRAS="$EXTRAS" python3 -c 'import os, tomllib; p = tomllib.load(open("/build/pyproject.toml", "rb"))["project"]; \
print("\n".join(p["dependencies"] + [r for e in os.environ["EXTRAS"].split() for r in p["optional-dependencies"][e]]))' \
        > /build/requirements.txt; \
    /opt/xclp/venv/bin/pip install --requirement /build/requirements.txt || { \
        echo "xclp: installing the dependencies from the package index failed. Offline, run scripts/docker-prepare:" >&2; \
        echo "xclp: it builds xclp:dev from Debian packages and a local wheelhouse (docs/docker.md)." >&2; \
        exit 1; }; \
    # The bundled test suites of numpy, scipy, numba and the dask extra's packages (~50 MB) are
    # never imported at run time; tornado's holds a test private key, which no image may carry.
    site=$(/opt/xclp/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
    find "$site/numpy" "$site/scipy" "$site/numba" -depth -type d -name tests -exec rm -rf {} +; \
    for pkg in tornado distributed dask; do \
        [ ! -d "$site/$pkg" ] || find "$site/$pkg" -depth -type d \( -name tests -o -name test \) -exec rm -rf {} +; \
    done

# The container health check (see HEALTHCHECK below): a coordinator must answer the gRPC health
# service (docker/healthcheck.py says how it finds the port and the CA); a container that runs no
# `xclp-server serve` (a party, an agent) reports healthy. Before the sources: it rarely changes.
COPY docker/healthcheck.py /opt/xclp/healthcheck.py

# The package itself. pip's isolated build environment honours PIP_NO_INDEX/PIP_FIND_LINKS, so in
# offline mode setuptools and wheel come from the wheelhouse too.
COPY pyproject.toml README.md /src/
COPY xclp /src/xclp
COPY crypto /src/crypto
COPY server /src/server
COPY client /src/client
RUN set -eu; \
    if [ "$WHEELHOUSE" = 1 ]; then export PIP_NO_INDEX=1 PIP_FIND_LINKS=/build; fi; \
    /opt/xclp/venv/bin/pip install --no-deps /src; \
    # pip and setuptools (from ensurepip) are build tools: the runtime image does without them.
    /opt/xclp/venv/bin/python -m pip uninstall --yes --quiet setuptools pip; \
    # Smoke test of the finished venv: both CLIs import, numba compiles, the Hamming kernel runs.
    /opt/xclp/venv/bin/xclp-server --help >/dev/null; \
    /opt/xclp/venv/bin/xclp-client --help >/dev/null; \
    case " $EXTRAS " in *" dask "*) /opt/xclp/venv/bin/python -c 'import distributed' ;; esac; \
    NUMBA_CACHE_DIR=/tmp/numba-smoke /opt/xclp/venv/bin/python -c 'import numpy as np; from xclp.hamming import hamming_matrix; \
assert (hamming_matrix(np.array([[0], [7]], dtype=np.uint64)) == [[0, 3], [3, 0]]).all()'; \
    rm -rf /tmp/numba-smoke



FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="xclp" \
      org.opencontainers.image.description="Secure multi-party label propagation (XCLP), FlyNN and RACE: coordinator (xclp-server) and party (xclp-client)" \
      org.opencontainers.image.licenses="Apache-2.0"

# A fixed non-root uid so volume ownership and Kubernetes runAsNonRoot checks are predictable.
# /var/lib/xclp is the working directory: a named volume mounted there starts out owned by xclp.
RUN groupadd --gid 10001 xclp \
 && useradd --uid 10001 --gid 10001 --home-dir /home/xclp --create-home --shell /usr/sbin/nologin xclp \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/xclp

# No keys, certificates or job files are baked in: mount them (e.g. at /var/lib/xclp).
# site-packages is read-only for xclp, so numba's on-disk JIT cache goes to /tmp.
# (Everything but the venv comes first, so that a change of the sources rebuilds one layer here.)
ENV PATH="/opt/xclp/venv/bin:${PATH}" \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NUMBA_CACHE_DIR=/tmp/numba-cache
USER 10001:10001
WORKDIR /var/lib/xclp
EXPOSE 50051
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["/opt/xclp/venv/bin/python", "/opt/xclp/healthcheck.py"]
# No ENTRYPOINT: the command is the whole invocation, `xclp-server ...` or `xclp-client ...`.
CMD ["xclp-server", "--help"]

COPY --from=builder /opt/xclp /opt/xclp
