# One image for every Gearshift daemon; the command picks the service.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY protos protos
COPY services services
COPY client client
COPY migrations migrations
COPY examples examples
RUN pip install --no-cache-dir '.[all]'
ENV GEARSHIFT_LOG_FORMAT=json
CMD ["gearshift", "--help"]
