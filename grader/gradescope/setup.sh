#!/usr/bin/env bash
# Gradescope runs this once, when it builds the autograder image (Ubuntu, as root).
# torch comes from PyTorch's CPU index (PyPI's Linux build drags in GBs of CUDA libraries that a
# CPU-only container never uses), alone; then the rest from PyPI: requirements-gradescope.txt
# (what grading needs) held to requirements.txt's pins (the kit's runtime pins, as constraints:
# what torch and the others pull in gets the kit's versions too). No test tools.
set -euo pipefail
cd /autograder/source
apt-get update -q
apt-get install -y -q --no-install-recommends python3 python3-pip python3-venv
python3 -m venv /autograder/venv
torch=$(grep -i '^torch==' requirements-gradescope.txt)
/autograder/venv/bin/pip install -q --no-deps --index-url https://download.pytorch.org/whl/cpu "$torch"
/autograder/venv/bin/pip install -q -r requirements-gradescope.txt -c requirements.txt
