# Kept where device commands have always sourced it (`source scripts/device_setup.sh;`):
# the setup itself is scripts/gpu/device_setup.sh.
source scripts/gpu/device_setup.sh
