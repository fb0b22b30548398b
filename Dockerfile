# One image for every part of the deployment (docker-compose.yml): the API, the study runner, the
# Ray head and the GPU Ray workers. Ray needs the same Ray and Python versions on every node.
# PyPI's torch wheels carry their CUDA libraries: a GPU host needs the NVIDIA driver and the NVIDIA
# Container Toolkit, nothing else.
FROM python:3.12-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tuner tuner
COPY objectives objectives
COPY kernels kernels
COPY models models
COPY search_spaces search_spaces
COPY api api
RUN pip install --no-cache-dir ".[postgres]"
# Triton and Inductor caches survive a container restart when /cache is a volume.
ENV TRITON_CACHE_DIR=/cache/triton TORCHINDUCTOR_CACHE_DIR=/cache/inductor TUNER_CACHE_DIR=/cache/tuner
EXPOSE 8000 6379
CMD ["tuner", "--help"]
