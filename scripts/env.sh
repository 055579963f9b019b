# Sourced by the scripts: the CMake from PyPI first on PATH, mpirun allowed as root.
pybin=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null || true)
[[ -n "$pybin" && -d "$pybin" ]] && export PATH="$pybin:$PATH"
for c in $(which -a cmake 2>/dev/null); do
  if "$c" --version | head -1 | awk '{split($3,v,"."); exit !(v[1]>3 || (v[1]==3 && v[2]>=31))}'; then
    CMAKE="$c"; break
  fi
done
export CMAKE=${CMAKE:-cmake}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
