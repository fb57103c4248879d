# The warmscope app and simulator image (docker-compose.yml: services app, simulator).
FROM python:3.11.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 WARMSCOPE_DATA_DIR=/data
WORKDIR /opt/warmscope
COPY pyproject.toml README.md ./
COPY collectors ./collectors
COPY analysis ./analysis
COPY app ./app
COPY simulator ./simulator
RUN pip install --no-cache-dir ".[app]" && mkdir -p /data
EXPOSE 8501
CMD ["warmscope", "dashboard", "--address", "0.0.0.0"]
