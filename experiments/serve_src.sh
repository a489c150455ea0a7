#!/bin/sh
# `tandem serve` as the source tree in $TANDEM_SRC computes it (another revision's src/), under
# llama-server's command line: as `tandem bench --llama-server`, its rows ("llama.cpp none",
# "llama.cpp ngram-simple") measure a change against the code before it, in the same turns.
#
#   git worktree add /tmp/base REV
#   TANDEM_SRC=/tmp/base/src tandem bench -m default --spec-type ngram-simple \
#       --llama-server experiments/serve_src.sh --llama-spec-types ngram-simple ...
: "${TANDEM_SRC:?set TANDEM_SRC to the src/ folder of the tree to serve}"
PYTHONPATH="$TANDEM_SRC" exec "${TANDEM_BIN:-tandem}" serve "$@"
