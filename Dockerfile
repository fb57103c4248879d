# The warmscope app and simulator image (docker-compose.yml: services app, simulator).
# It copies exactly what `pip install .` needs: the build files, the six source folders and
# the rule files (tests/deploy/test_packaging.py builds a wheel from this context).
FROM python:3.11.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 WARMSCOPE_DATA_DIR=/data
WORKDIR /opt/warmscope
COPY pyproject.toml setup.py README.md LICENSE ./
COPY model ./model
COPY collectors ./collectors
COPY sources ./sources
COPY analysis ./analysis
COPY simulator ./simulator
COPY app ./app
COPY rules ./rules
RUN pip install --no-cache-dir ".[app]" && mkdir -p /data && chmod 0700 /data
EXPOSE 8501
# Loopback by default: the dashboard has no login. docker-compose.yml binds it to
# 0.0.0.0 inside the container and publishes it on the host's 127.0.0.1 only; to
# serve other machines, put an authenticating proxy in front.
CMD ["warmscope", "dashboard", "--address", "127.0.0.1"]
