#!/bin/sh
# `pip install` inside an image build (deploy/docker/Dockerfile), into the
# service's virtual environment /opt/tidelog, from the context's wheelhouse
# only: no index, no network. pip runs from its own wheel, so it is not
# installed into the image.
exec /opt/tidelog/bin/python /wheelhouse/pip.whl/pip install --quiet --no-index \
    --no-cache-dir --disable-pip-version-check \
    --find-links /wheelhouse/deps --find-links /wheelhouse/tidelog "$@"
