# cachekit in a container: `docker build -t cachekit .` (CPU torch), or for GPUs
#   docker build -t cachekit:cuda --build-arg BASE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime --build-arg TORCH=skip .
# then `docker run --rm --shm-size=8g -v /data:/data cachekit build /data/raw --out /data/cache`.
# --shm-size (or --ipc=host): DataLoader worker processes hand batches over through /dev/shm, and
# Docker's default 64 MB holds only a few; cachekit reads in-process when it is short.
ARG BASE=python:3.11-slim
FROM ${BASE}

# CPU wheel by default; "skip" keeps the torch the base image brings (a CUDA image's own build).
ARG TORCH="torch --index-url https://download.pytorch.org/whl/cpu"

ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /opt/cachekit
COPY pyproject.toml README.md LICENSE ./
COPY setup.py ./
COPY cachekit ./cachekit
COPY pipelines ./pipelines
# CI runs these install lines as written (.ci/install_check), outside Docker
RUN if [ "$TORCH" != "skip" ]; then pip install $TORCH; fi \
 && pip install '.[dask,plot]'

WORKDIR /data
ENTRYPOINT ["cachekit"]
CMD ["--help"]
