# dynatune in a container: the same locked dependency set as the README's install (constraints.txt),
# tuning configs/quickstart.yaml by default. Tuning measures the machine it runs on, so run it on the
# machine (or kind of machine) the model will be deployed to.
#
#   docker build -t dynatune .
#   docker run --rm -v $PWD/runs:/app/runs dynatune                      # configs/quickstart.yaml
#   docker run --rm -v $PWD/runs:/app/runs dynatune tune configs/x.yaml --budget 600
#
# The image also serves as a Prefect docker work pool's image (DYNATUNE_HOME=/app is what prefect.yaml's
# pull step changes into; see docs/operations.md).
FROM python:3.11-slim

# g++ (with gcc and binutils): the compiled model is linked into a shared library by the system compiler, each
# batch of tuned candidates by binutils' ld with gcc's libgcc.a (dynatune/search/linker.py)
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    DYNATUNE_HOME=/app \
    PREFECT_HOME=/app/runs/.prefect \
    PREFECT_SERVER_ANALYTICS_ENABLED=false

WORKDIR /app
COPY . .
# exactly the README's install command (without its venv): the locked set in constraints.txt
RUN pip install -c constraints.txt -e .

ENTRYPOINT ["dynatune"]
CMD ["tune", "configs/quickstart.yaml"]
