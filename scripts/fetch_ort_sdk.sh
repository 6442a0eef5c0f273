#!/usr/bin/env bash
# Lays out the ONNX Runtime C/C++ SDK (headers + libonnxruntime.so) like an official release,
# from the npm registry package that ships the official binaries. The tarball's integrity is
# checked against a pinned hash before anything is unpacked.
# Usage: fetch_ort_sdk.sh DEST   (skips all work when DEST already holds the pinned version)
set -euo pipefail
dest=${1:?usage: fetch_ort_sdk.sh DEST}
pkg=com.github.asus4.onnxruntime
ver=0.4.9          # carries ONNX Runtime 1.29.0
ort_version=1.29.0
integrity='sha512-BkzxduSZ9IkeDP6Q8lz2TFU2ie7hSSvS7ZIfzMooExoq0CNzJnuuGaUJ7IsojBgqO4ouD1jXah8OYyJbCN29Fg=='
stamp="$dest/.opbridge-sdk"

if [ "$(uname -s)/$(uname -m)" != "Linux/x86_64" ]; then
  echo "[opbridge] the ONNX Runtime SDK from the npm registry ships Linux x86_64 binaries only;" \
       "this is $(uname -s)/$(uname -m): set ONNXRUNTIME_ROOT to an official ONNX Runtime release" >&2
  exit 1
fi

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$pkg@$ver $integrity" ]; then
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "[opbridge] fetching ONNX Runtime $ort_version SDK ($pkg@$ver from the npm registry)"
(cd "$work" && npm pack --silent "$pkg@$ver" >/dev/null)
tgz="$work/$pkg-$ver.tgz"
actual="sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)"
if [ "$actual" != "$integrity" ]; then
  echo "[opbridge] integrity mismatch for $pkg@$ver: got $actual" >&2
  exit 1
fi
tar xzf "$tgz" -C "$work"
headers="$work/package/Plugins/iOS~/onnxruntime.xcframework/ios-arm64_x86_64-simulator/onnxruntime.framework/Headers"
lib="$work/package/Plugins/Linux/x64/libonnxruntime.so"
rm -rf "$dest"
mkdir -p "$dest/include" "$dest/lib"
cp "$headers"/*.h "$dest/include/"
cp "$lib" "$dest/lib/libonnxruntime.so.$ort_version"
ln -s "libonnxruntime.so.$ort_version" "$dest/lib/libonnxruntime.so.1"
ln -s libonnxruntime.so.1 "$dest/lib/libonnxruntime.so"
cp "$work/package/LICENSE"* "$dest/" 2>/dev/null || true
echo "$ort_version" > "$dest/VERSION_NUMBER"
echo "$pkg@$ver $integrity" > "$stamp"
echo "[opbridge] ONNX Runtime SDK ready in $dest"
