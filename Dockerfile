# One image for every role of the workbench; the command picks the role:
#   rlwb worker | rlwb ui --host 0.0.0.0 | rlwb db upgrade | rlwb up | rlwb train CONFIG
# Serving the UI on a non-loopback address needs a password (RLWB_AUTH=user:password or
# --auth): the default command refuses to start without one.
# The default PyPI torch wheel for Linux x86-64 includes CUDA and also runs on CPU.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    OMP_NUM_THREADS=1 \
    HF_HUB_OFFLINE=1 \
    HF_HUB_DISABLE_TELEMETRY=1 \
    GRADIO_ANALYTICS_ENABLED=False \
    RLWB_DATA_DIR=/data

WORKDIR /app
COPY pyproject.toml README.md ./
COPY core_engine ./core_engine
COPY db ./db
COPY workers ./workers
COPY ui ./ui
RUN pip install . \
    && useradd --create-home --uid 1000 rlwb \
    && mkdir -p /data && chown rlwb /data

USER rlwb
VOLUME ["/data"]
EXPOSE 7860
ENTRYPOINT ["rlwb"]
CMD ["up", "--host", "0.0.0.0"]
