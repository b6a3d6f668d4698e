#!/bin/bash
# Wall time of the README's `cconv advise` command against one `cconv run` of its dense config,
# whole processes one after the other (the numbers in docs/advise.md, "The README's command").
# With a commit as $1 the advise of that commit runs first (a worktree under $TMPDIR), for a
# before/after comparison in the same sequence.  Run from the repository root:
#     bash studies/advise/readme_wall.sh [COMMIT]
set -euo pipefail
root=$(pwd)
py="$root/.venv/bin/python"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; [ -n "${old:-}" ] && git -C "$root" worktree remove --force "$old" >/dev/null 2>&1 || true' EXIT
"$py" -c "import yaml; yaml.safe_dump(yaml.safe_load(open('studies/quickstart.yaml'))['base'], open('$tmp/dense.yaml', 'w'))"
args=(advise "$root/studies/quickstart.yaml" --cluster 4x8 --intra NVLink --network 10GbE)
timed() {  # label, directory to run in, command...
  local label=$1 dir=$2; shift 2
  local s e
  s=$(date +%s.%N)
  (cd "$dir" && PYTHONPATH="$dir" "$@") > "$tmp/$label.log" 2>&1
  if [ -n "${KEEP_LOGS:-}" ]; then cp "$tmp/$label.log" "$KEEP_LOGS-$label.log"; fi
  e=$(date +%s.%N)
  printf '%-8s %6.1f s  %s\n' "$label" "$(echo "$e - $s" | bc)" "$(grep -o '([0-9]* s in all[^)]*)' "$tmp/$label.log" || true)"
}
if [ $# -ge 1 ]; then
  old="$tmp/old"
  git -C "$root" worktree add --detach "$old" "$1" >/dev/null
  timed "before" "$old" "$py" -m cconv "${args[@]}" --out "$tmp/advise-before"
fi
timed "advise" "$root" "$py" -m cconv "${args[@]}" --out "$tmp/advise"
timed "dense" "$root" "$py" -m cconv run "$tmp/dense.yaml" --out "$tmp/dense"
