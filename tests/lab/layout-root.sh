#!/bin/sh
# A root file system like the machine's with an installer's tree laid over it, private to
# one test: tests/integration/layouts.rs runs claudebox in it.
#
#   unshare --mount --propagation private sh layout-root.sh ROOT UID GID CWD SPEC... -- CMD...
#                                                       (as root)
#   unshare --user --map-root-user --mount --propagation private sh layout-root.sh ...
#                                                       (as an ordinary user)
#
# ROOT (an empty directory of the test's) becomes a tmpfs showing each top-level entry of
# the machine's root (directories bound recursively, symlinks as symlinks), then each SPEC:
#   over:SRC:DEST   SRC laid over the existing directory DEST (a read-only overlay:
#                   /usr/local with an npm prefix's bin/ and lib/ added, /home with
#                   linuxbrew/ added)
#   bind:SRC:DEST   SRC bound at DEST, the directory made when missing (/nix, a directory
#                   in the test's home)
#   hide:DEST       /dev/null over the file DEST (the system's node, on a machine whose only
#                   node is nvm's or Homebrew's)
# The tmpfs is then made read-only, becomes the root (pivot_root, so that user namespaces
# can still be made in it: the kernel refuses them in a chroot), and CMD runs in CWD as
# UID:GID (an ordinary user: in a nested user namespace mapping it back; root-owned files
# show as nobody there, as in any user namespace). Nothing of it is seen outside the
# namespace; it ends with its last process.
set -eu
root=$1 uid=$2 gid=$3 cwd=$4
shift 4
mount -t tmpfs -o mode=755 layout-root "$root"
for e in /* /.[!.]*; do
    [ -e "$e" ] || [ -L "$e" ] || continue
    n=${e#/}
    if [ -L "$e" ]; then
        ln -s "$(readlink "$e")" "$root/$n"
    elif [ -d "$e" ]; then
        mkdir "$root/$n"
        mount --rbind "$e" "$root/$n"
    else
        : >"$root/$n"
        mount --bind "$e" "$root/$n"
    fi
done
while [ "$#" -gt 0 ] && [ "$1" != -- ]; do
    spec=$1
    shift
    case "$spec" in
        over:*)
            rest=${spec#over:} src=${rest%%:*} dest=${rest#*:}
            mount -t overlay layout-over -o "lowerdir=$src:$root$dest" "$root$dest"
            ;;
        bind:*)
            rest=${spec#bind:} src=${rest%%:*} dest=${rest#*:}
            mkdir -p "$root$dest"
            mount --rbind "$src" "$root$dest"
            ;;
        hide:*) mount --bind /dev/null "$root${spec#hide:}" ;;
        *) echo "layout-root: unknown spec $spec" >&2; exit 2 ;;
    esac
done
[ "${1:-}" = -- ] && shift
mkdir "$root/.layout-old"
mount -o remount,bind,ro "$root"
cd "$root"
pivot_root . .layout-old
umount -l /.layout-old
cd "$cwd"
if [ "$uid" = 0 ]; then exec "$@"; fi
exec unshare --user --map-user="$uid" --map-group="$gid" -- "$@"
