#!/usr/bin/env bash
# Offline checks of deploy/ (no cluster, no network beyond installing the validator once):
#  - every manifest in deploy/k8s (but kustomization.yaml) validates against the Kubernetes
#    OpenAPI schemas bundled in kubernetes-validate, strictly (unknown fields are errors), for
#    the oldest Kubernetes the manifests target and the newest the tool bundles; a kind or
#    apiVersion with no schema is an error too,
#  - kustomization.yaml lists only files that exist, and every manifest is either listed or
#    named in its comments,
#  - configmap-profile.yaml carries profiles/16gb.yaml unchanged,
#  - the batch Job's `completions` equals the N of its `--shard $(JOB_COMPLETION_INDEX)/N`,
#    and its podFailurePolicy ends an index on exit code 2 (ocrctl ocr: some inputs failed),
#  - deploy/Containerfile pins the ONNX Runtime, pypdfium2 and TensorRT-RTX plugin versions of
#    scripts/setup.sh.
# Exits non-zero naming the file on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
KV_VERSION=1.37.0
# 1.33: backoffLimitPerIndex (job-batch-ocr.yaml) is GA there; the preStop sleep action
# (deployment.yaml) needs 1.30 or later.
K8S_VERSIONS=(1.33.0 1.37.0)

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if [ "$(.venv/bin/kubernetes-validate --version 2>/dev/null)" != "$KV_VERSION" ]; then
  .venv/bin/pip install --quiet --disable-pip-version-check "kubernetes-validate==$KV_VERSION"
fi

fail=0
k_args=()
for v in "${K8S_VERSIONS[@]}"; do k_args+=(-k "$v"); done
for f in deploy/k8s/*.yaml; do
  [ "$(basename "$f")" = kustomization.yaml ] && continue
  # --quiet prints only warnings and errors: any output (e.g. "Couldn't find schema") fails.
  if ! out=$(.venv/bin/kubernetes-validate --strict --quiet "${k_args[@]}" "$f" 2>&1) || [ -n "$out" ]; then
    echo "FAIL $f:"
    echo "$out" | sed 's/^/  /'
    fail=1
  fi
done

.venv/bin/python - <<'EOF' || fail=1
import os, re, sys, yaml

bad = []
k8s = "deploy/k8s"

kust_path = f"{k8s}/kustomization.yaml"
kust_text = open(kust_path).read()
listed = yaml.safe_load(kust_text).get("resources") or []
for r in listed:
    if not os.path.isfile(os.path.join(k8s, r)):
        bad.append(f"{kust_path}: lists {r}, which does not exist")
for f in sorted(os.listdir(k8s)):
    if f.endswith(".yaml") and f != "kustomization.yaml" and f not in listed and f not in kust_text:
        bad.append(f"{kust_path}: neither lists nor mentions {f}")

cm_path = f"{k8s}/configmap-profile.yaml"
cm = yaml.safe_load(open(cm_path))
if cm["data"].get("profile.yaml") != open("profiles/16gb.yaml").read():
    bad.append(f"{cm_path}: data.profile.yaml differs from profiles/16gb.yaml")

job_path = f"{k8s}/job-batch-ocr.yaml"
job = yaml.safe_load(open(job_path))
args = " ".join(job["spec"]["template"]["spec"]["containers"][0]["args"])
m = re.search(r"--shard \$\(JOB_COMPLETION_INDEX\)/(\d+)", args)
if not m:
    bad.append(f"{job_path}: no --shard $(JOB_COMPLETION_INDEX)/N in args")
elif int(m.group(1)) != job["spec"]["completions"]:
    bad.append(f"{job_path}: --shard .../{m.group(1)} but completions {job['spec']['completions']}")

# Exit code 2 (some inputs failed, listed in failures.*.jsonl) ends the shard's index, no retry.
rules = (job["spec"].get("podFailurePolicy") or {}).get("rules") or []
if not any(r.get("action") == "FailIndex" and 2 in (r.get("onExitCodes") or {}).get("values", [])
           and (r.get("onExitCodes") or {}).get("operator") == "In" for r in rules):
    bad.append(f"{job_path}: no podFailurePolicy rule FailIndex on exit code 2 (some inputs failed)")

def default(path, var):
    m = re.search(rf'^{var}="\$\{{{var}:-([^}}]+)\}}"', open(path).read(), re.M)
    return m and m.group(1)

def arg(path, var):
    m = re.search(rf"^ARG {var}=(\S+)", open(path).read(), re.M)
    return m and m.group(1)

for var in ("ORT_VERSION", "PDFIUM_VERSION", "TRT_RTX_EP_VERSION"):
    want, got = default("scripts/setup.sh", var), arg("deploy/Containerfile", var)
    if not want or want != got:
        bad.append(f"deploy/Containerfile: ARG {var}={got}, scripts/setup.sh has {var} default {want}")

for b in bad:
    print("FAIL " + b)
sys.exit(1 if bad else 0)
EOF

if [ "$fail" != 0 ]; then
  echo "deploy checks failed" >&2
  exit 1
fi
n=$(find deploy/k8s -name '*.yaml' ! -name kustomization.yaml | wc -l)
echo "deploy checks passed: $n manifests valid for Kubernetes ${K8S_VERSIONS[*]} (kubernetes-validate $KV_VERSION, strict), kustomization, profile copy, job shards, Containerfile pins"
