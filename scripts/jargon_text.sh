#!/bin/sh
# The text of another domain `bench quality --corpus` was measured on (docs/model.md): the Jargon
# File 4.4.7 (public domain; a glossary of hacker slang, not encyclopaedia prose), from Debian's
# package jargon-text, written to out/texts/jargon.txt (1,681,817 bytes).
#   sh scripts/jargon_text.sh && moelambda bench quality --models minilm --seeds 0 \
#       --corpus out/texts/jargon.txt --json
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
apt-get download jargon-text 2>/dev/null
dpkg-deb -x jargon-text_*.deb unpacked
mkdir -p "$root/out/texts"
zcat unpacked/usr/share/doc/jargon-text/jargon.txt.gz > "$root/out/texts/jargon.txt.part"
mv "$root/out/texts/jargon.txt.part" "$root/out/texts/jargon.txt"
sha256sum "$root/out/texts/jargon.txt"
