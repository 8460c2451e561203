# On the GPU machine (no package index), from the repository root: install the wheels that
# scripts/gpu/fetch_wheels.sh laid out, brought one folder per transfer. Source it (it exports
# PYTHONPATH) after each transfer, naming the folder(s) this transfer brought:
#
#   source scripts/gpu/install_wheels.sh .gpuwheels/1        # first transfer
#   source scripts/gpu/install_wheels.sh .gpuwheels/2        # next transfer, same warm machine
#   source scripts/gpu/install_wheels.sh                     # later commands: the environment only
#
# Each call copies the folders' files to $PEER_STASH (/tmp/peer-wheels: it outlives one command
# on a machine that stays up); once every part of every wheel is there it joins the split ones,
# checks each wheel's SHA-256 against the manifests, and installs them all with
# `pip install --no-index --no-deps --target $PEER_SITE` (/tmp/peer-site). `--target` does not run
# `.pth` files, so this puts both $PEER_SITE and $PEER_SITE/nvidia_cutlass_dsl/dsl_packages (what
# nvidia-cutlass-dsl's .pth adds) first on PYTHONPATH. flash_attn.cute lives in the `flash_attn`
# namespace: where flash-attn 2 (a regular `flash_attn` package) is importable too, its package
# would hide flash_attn.cute, so `cute` is linked into flash-attn 2's package folder (its own older
# `cute` set aside as cute.flash-attn-2).
# Until all parts are there it says which are missing and installs nothing.
peer_stash=${PEER_STASH:-/tmp/peer-wheels}
peer_site=${PEER_SITE:-/tmp/peer-site}
mkdir -p "$peer_stash"
for _d in "$@"; do
  if [ -d "$_d" ]; then cp -f "$_d"/* "$peer_stash"/; else echo "install_wheels.sh: no folder $_d" >&2; fi
done
if [ ! -f "$peer_site/.installed" ] && ls "$peer_stash"/MANIFEST-* >/dev/null 2>&1; then
  if python3 scripts/gpu/wheels.py join "$peer_stash" "$peer_stash/whl" >/tmp/peer-join.log 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$peer_site" \
      "$peer_stash"/whl/*.whl >/tmp/peer-install.log 2>&1 && touch "$peer_site/.installed" \
      || cat /tmp/peer-install.log
  else
    echo "install_wheels.sh: not yet complete: $(tail -1 /tmp/peer-join.log)"
  fi
fi
if [ -f "$peer_site/.installed" ]; then
  case ":${PYTHONPATH:-}:" in
    *:"$peer_site":*) ;;
    *) export PYTHONPATH="$peer_site:$peer_site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}" ;;
  esac
  _fa2=$(cd / && python3 -c "
import importlib.util as u, os
s = u.find_spec('flash_attn')
print(os.path.dirname(s.origin) if s and s.origin and s.origin.endswith('__init__.py') else '')" 2>/dev/null)
  if [ -n "$_fa2" ] && [ "$_fa2" != "$peer_site/flash_attn" ] && [ ! -L "$_fa2/cute" ]; then
    # flash-attn 2.8.3 ships an older flash_attn/cute of its own (for an older CuTe DSL: importing
    # it with nvidia-cutlass-dsl 4.8.1 fails, "cutlass.cute.core has no attribute ThrMma", seen on
    # the H200): set it aside so that flash_attn.cute is FlashAttention-4's
    [ -e "$_fa2/cute" ] && mv "$_fa2/cute" "$_fa2/cute.flash-attn-2"
    ln -s "$peer_site/flash_attn/cute" "$_fa2/cute"
  fi
  unset _fa2
fi
unset _d peer_stash peer_site
