#!/usr/bin/env bash
# Re-fetches the Swagger UI files that /docs serves from npm into assets/,
# strips their source-map comments (the maps are not vendored, so a browser
# would ask for a missing file), rewrites assets/VENDORED.md and prints the
# sha256 of each file. One command refreshes them:
#
#   bash functions/docs/vendor.sh            # the pinned version below
#   bash functions/docs/vendor.sh 5.36.0     # another exact version
#
# Needs npm (for `npm pack`, which checks the tarball against the
# registry's integrity) and node, tar, sha256sum. Writes only assets/.
set -euo pipefail

PACKAGE=swagger-ui-dist
VERSION="${1:-5.35.0}"
FILES=(swagger-ui-bundle.js swagger-ui.css LICENSE)

case "$VERSION" in
  5.[0-9]*.[0-9]*) ;;
  *) echo "vendor.sh: want an exact 5.x version like 5.35.0, not '$VERSION'" >&2; exit 2 ;;
esac

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
assets="$here/assets"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# `npm pack` fetches the exact tarball without installing anything (no
# install scripts run) and reports its name and integrity as JSON.
(cd "$tmp" && npm pack --json --silent "$PACKAGE@$VERSION" >pack.json)
read -r tarball integrity < <(node -e '
  const p = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"))[0];
  if (p.name !== process.argv[2] || p.version !== process.argv[3]) {
    console.error(`npm packed ${p.name}@${p.version}, not ${process.argv[2]}@${process.argv[3]}`);
    process.exit(1);
  }
  console.log(p.filename, p.integrity);
' "$tmp/pack.json" "$PACKAGE" "$VERSION")
mkdir "$tmp/x"
tar -xzf "$tmp/$tarball" -C "$tmp/x"
pkg="$tmp/x/package"

mkdir -p "$assets"
for f in "${FILES[@]}"; do
  [ -f "$pkg/$f" ] || { echo "vendor.sh: $PACKAGE@$VERSION has no $f" >&2; exit 1; }
  cp "$pkg/$f" "$assets/$f"
done

# Source-map comments, whole lines only: `//# sourceMappingURL=...` (JS)
# and `/*# sourceMappingURL=... */` (CSS). One left inside a line of code
# fails the refresh rather than ship a reference to a missing map.
stripped=()
for f in swagger-ui-bundle.js swagger-ui.css; do
  before="$(sha256sum "$assets/$f")"
  sed -i \
    -e '/^[[:space:]]*\/\/[#@] sourceMappingURL=[^[:space:]]*[[:space:]]*$/d' \
    -e '/^[[:space:]]*\/\*[#@] sourceMappingURL=[^*]*\*\/[[:space:]]*$/d' \
    "$assets/$f"
  if grep -n '[#@] sourceMappingURL=' "$assets/$f" >&2; then
    echo "vendor.sh: $f still names a source map (above); strip it by hand" >&2
    exit 1
  fi
  [ "$before" = "$(sha256sum "$assets/$f")" ] || stripped+=("$f")
done

notice=""
[ -f "$pkg/NOTICE" ] && notice="$(sed 's/^/    /' "$pkg/NOTICE")"

{
  echo "# Vendored files"
  echo
  echo "Written by \`functions/docs/vendor.sh\`; refresh with"
  echo "\`bash functions/docs/vendor.sh [version]\`, do not edit by hand."
  echo
  echo "- Package: \`$PACKAGE\` (npm), exact version **$VERSION**"
  echo "- Tarball: \`$tarball\`, integrity \`$integrity\`"
  echo "  (check: \`npm view $PACKAGE@$VERSION dist.integrity\`)"
  echo "- License: Apache-2.0, the package's \`LICENSE\` is vendored beside these files"
  echo
  echo "| file | bytes | sha256 |"
  echo "|------|------:|--------|"
  for f in "${FILES[@]}"; do
    echo "| \`$f\` | $(wc -c <"$assets/$f") | \`$(sha256sum "$assets/$f" | cut -d' ' -f1)\` |"
  done
  echo
  if [ "${#stripped[@]}" -gt 0 ]; then
    echo "Changed from the package: the \`sourceMappingURL\` comment line removed"
    echo "from ${stripped[*]} (the source maps are not vendored). Otherwise"
    echo "byte for byte as published."
  else
    echo "Byte for byte as published (no source-map comment to remove)."
  fi
  echo
  echo "Not vendored: the package's other files (other bundles, source maps,"
  echo "\`index.html\`, \`swagger-initializer.js\`, favicons). \`init.js\` in this"
  echo "folder is ours, not the package's: it starts Swagger UI on"
  echo "\`/openapi.json\` with the validator off."
  if [ -n "$notice" ]; then
    echo
    echo "The package's NOTICE file reads:"
    echo
    echo "$notice"
  fi
  if [ -f "$pkg/swagger-ui-bundle.js.LICENSE.txt" ]; then
    echo
    echo "The bundle's first line points to \`swagger-ui-bundle.js.LICENSE.txt\`"
    echo "(the licence notices of the libraries bundled into it), which is in"
    echo "the package but not vendored here."
  fi
} >"$assets/VENDORED.md"

echo "$PACKAGE@$VERSION ($integrity)"
(cd "$assets" && sha256sum "${FILES[@]}")
