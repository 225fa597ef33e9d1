cd /work/main
export VIRTUAL_ENV=/work/main/.venv
D=/tmp/demo19/run/drafter
for round in 1 2; do
  for name in trained hybrid hybrid-always ngram; do
    case $name in
      trained) args="--drafter $D";;
      hybrid) args="--drafter hybrid:$D --lookup-branch useful";;
      hybrid-always) args="--drafter hybrid:$D --lookup-branch always";;
      ngram) args="--drafter ngram --max-draft 3";;
    esac
    .venv/bin/python -m dflash.cli.evaluate $args --cycle static --target tiny-stdlib --prompts /tmp/demo19/code-prompts.jsonl --max-new-tokens 128 --device cpu --json --quiet > /tmp/demo19/$name-$round.json 2> /tmp/demo19/$name-$round.err
    echo "$name $round rc $?" >> /tmp/demo19/evals.log
  done
done
