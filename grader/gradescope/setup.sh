#!/usr/bin/env bash
# Gradescope runs this once, when it builds the autograder image (Ubuntu, as root).
# torch comes from PyTorch's CPU index (PyPI's Linux build drags in GBs of CUDA libraries that a
# CPU-only container never uses); the rest from PyPI, at the versions the kit pins.
set -euo pipefail
cd /autograder/source
apt-get update -q
apt-get install -y -q --no-install-recommends python3 python3-pip python3-venv
python3 -m venv /autograder/venv
torch=$(grep -i '^torch==' requirements-gradescope.txt)
/autograder/venv/bin/pip install -q --index-url https://download.pytorch.org/whl/cpu "$torch"
/autograder/venv/bin/pip install -q -r requirements-gradescope.txt
