# The Srifty worker image: what a training VM runs, the alternative to the worker wheel the
# EC2 user data installs (docs/deploy.md, "From an AWS connection to a finished multi-VM job").
# A CUDA runtime base, Python 3.11 and the wheel of this checkout with its `worker` extra
# (torch, transformers, fsspec, s3fs), pinned by requirements.lock; no Airflow, MLflow,
# Celery or Postgres (the build fails if any of them got in).
# Build from the repository root, passing PyTorch's CUDA 12.8 wheel index as TORCH_INDEX_URL
# (without it, the locked torch version comes from the default index like the rest):
#   docker build -f docker/worker.Dockerfile --build-arg TORCH_INDEX_URL=... -t srifty-worker .

# Stage 1: the wheel of this checkout (`pip wheel --no-deps .`, the same file
# srifty_core/jobs/artifact.py builds for the VMs); only what goes into the wheel is copied.
FROM python:3.11-slim AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY srifty_core ./srifty_core
RUN pip wheel --no-cache-dir --no-deps . -w /wheels

# Stage 2: the worker. The NVIDIA driver comes from the host (the NVIDIA container toolkit:
# docker run --gpus all); NCCL and cuDNN come with torch's CUDA wheels.
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04

ARG TORCH_INDEX_URL=""
ARG SRIFTY_UID=50000

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/srifty/bin:$PATH

# Python 3.11 (Ubuntu 22.04's universe), a non-root user that owns the run folder.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid "${SRIFTY_UID}" --gid 0 --create-home --shell /bin/bash srifty \
 && python3.11 -m venv /opt/srifty \
 && mkdir -p /opt/srifty/run \
 && chown srifty:0 /opt/srifty/run

# The venv is /opt/srifty, as on a VM the user data set up: the start script
# (srifty_core/worker/rendezvous.py) runs /opt/srifty/bin/torchrun in either.
COPY requirements.lock /tmp/requirements.lock
COPY --from=wheel /wheels/ /tmp/wheels/
RUN pip install --no-cache-dir --upgrade 'pip>=25' \
 && if [ -n "${TORCH_INDEX_URL}" ]; then \
      pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" \
        "$(grep '^torch==' /tmp/requirements.lock)"; \
    fi \
 && whl="$(ls /tmp/wheels/srifty-*-py3-none-any.whl)" \
 && pip install --no-cache-dir -c /tmp/requirements.lock "${whl}[worker]" \
 && pip check \
 && ! pip list --format=freeze | grep -iE '^(apache-airflow|mlflow|celery|psycopg)' \
 && rm -rf /tmp/wheels /tmp/requirements.lock

WORKDIR /opt/srifty/run
USER srifty

# One rank: python -m srifty_core.worker.worker PLAN.json with torchrun's variables set;
# a multi-VM group: --entrypoint /opt/srifty/bin/torchrun (docs/deploy.md).
ENTRYPOINT ["python", "-m", "srifty_core.worker.worker"]
