#!/bin/bash
# deploy/runtime-deps.sh BINARY...: prints, one per line, the dpkg packages that own the shared
# libraries the binaries load (ldd's resolution, so transitive dependencies are included).
# The runtime image installs exactly this list, which is why it is derived rather than written:
# Ubuntu 24.04 renamed many library packages (the 64-bit time_t "t64" transition: libgrpc++1.51t64,
# libprotobuf32t64, ...), Debian 12 did not, and a hand-kept list would be wrong on one of them.
# Fails on a library that is not found, except the NVIDIA driver's (libcuda, libnvidia-ml), which
# the NVIDIA container toolkit mounts into the container at run time, and on a library owned by a
# -dev package (the runtime image must not need development packages).
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: runtime-deps.sh BINARY..." >&2; exit 1; }
driver_libs='^(libcuda\.so|libnvidia-ml\.so|libnvidia-ptxjitcompiler\.so)'
owner() {  # PATH -> package name, trying the path, its real path and the usr-merged twin
  local p cand
  for cand in "$1" "$(realpath -m "$1")"; do
    for p in "$cand" "/usr${cand}" "${cand#/usr}"; do
      local out
      if out=$(dpkg -S "$p" 2>/dev/null); then
        out=${out%%$'\n'*}
        out=${out%%: *}
        echo "${out%%:*}"
        return 0
      fi
    done
  done
  return 1
}
declare -A pkgs=()
status=0
for bin in "$@"; do
  [ -f "$bin" ] || { echo "runtime-deps.sh: $bin: no such file" >&2; exit 1; }
  while read -r line; do
    case "$line" in
      *"=> not found"*)
        lib=${line%% *}
        if [[ $lib =~ $driver_libs ]]; then continue; fi
        echo "runtime-deps.sh: $bin needs $lib, which is not installed" >&2
        status=1
        continue
        ;;
      linux-vdso* | linux-gate*) continue ;;
      *"=> "/*) path=${line#*=> } ;;
      /*) path=$line ;;
      *) continue ;;
    esac
    path=${path%% (0x*}
    if ! pkg=$(owner "$path"); then
      echo "runtime-deps.sh: $path (needed by $bin) belongs to no package" >&2
      status=1
      continue
    fi
    if [[ $pkg == *-dev ]]; then
      echo "runtime-deps.sh: $path (needed by $bin) comes from the development package $pkg" >&2
      status=1
      continue
    fi
    pkgs[$pkg]=1
  done < <(ldd "$bin")
done
((status == 0)) || exit "$status"
printf '%s\n' "${!pkgs[@]}" | sort
