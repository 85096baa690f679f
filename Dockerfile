# One image for every Gearshift daemon; the compose file picks the command.
FROM python:3.11-slim
# CPU wheels of torch by default; pass --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu124
# (or any CUDA index) for GPU workers.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
WORKDIR /app
COPY pyproject.toml README.md ./
COPY protos protos
COPY services services
COPY client client
COPY migrations migrations
COPY examples examples
RUN pip install --no-cache-dir --extra-index-url "${TORCH_INDEX}" '.[all]'
ENV GEARSHIFT_LOG_FORMAT=json
# Unprivileged at run time; checkpoints and work files live in volumes.
RUN useradd --create-home gearshift \
    && mkdir -p /var/lib/gearshift/checkpoints /var/lib/gearshift/work \
    && chown -R gearshift /var/lib/gearshift
USER gearshift
CMD ["gearshift", "--help"]
