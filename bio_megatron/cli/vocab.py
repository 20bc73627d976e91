"""``bio-megatron vocab``: learn a domain WordPiece, byte-level BPE or SentencePiece (ALBERT) vocabulary; measure
how well a vocabulary fits NER data."""

from __future__ import annotations

import argparse
import json
import sys


def _train(args: argparse.Namespace) -> int:
    from bio_megatron.utils.io import check_output_dir, check_output_file
    from bio_megatron.vocab.train import train_bpe_vocab, train_vocab

    if args.type == "bpe":  # a folder (vocab.json + merges.txt + tokenizer.json), not a single file
        output = "bpe_vocab" if args.output is None else args.output
        check_output_dir(output, "vocab train")
        res = train_bpe_vocab(args.input, output, size=args.size or 50_265, max_sentences=args.max_sentences)
        json.dump(res, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if args.type == "sentencepiece":  # one file, ALBERT's spiece.model; lower-cased unless --cased, as ALBERT
        from bio_megatron.vocab.train import train_sentencepiece_vocab

        output = "spiece.model" if args.output is None else args.output
        check_output_file(output)  # before SentencePiece trains, not after
        res = train_sentencepiece_vocab(args.input, output, size=args.size or 30_000,
                                        lowercase=args.uncased is not False, max_sentences=args.max_sentences,
                                        threads=args.threads)
        json.dump(res, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    args.output = args.output or "vocab.txt"
    args.size = args.size or 30000
    check_output_file(args.output)  # before SentencePiece trains, not after
    res = train_vocab(args.input, args.output, size=args.size, lowercase=bool(args.uncased),
                      model_type=args.model_type, max_sentences=args.max_sentences, threads=args.threads)
    json.dump(res, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _stats(args: argparse.Namespace) -> int:
    from bio_megatron.vocab.builtin import resolve_vocab
    from bio_megatron.vocab.stats import vocab_stats

    lowercase = True if args.lowercase else False if args.cased else None
    res = vocab_stats(resolve_vocab(args.vocab), args.ner_file, lowercase=lowercase)
    json.dump(res, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("vocab", help="train a WordPiece vocabulary; Table 3 sub-token statistics")
    sub = p.add_subparsers(dest="vocab_command", metavar="STEP", required=True)

    t = sub.add_parser("train", help="JSONL documents -> BERT WordPiece vocab.txt (SentencePiece) or, with "
                                     "--type bpe, a RoBERTa byte-level BPE folder (vocab.json + merges.txt), or, "
                                     "with --type sentencepiece, an ALBERT spiece.model")
    t.add_argument("--input", nargs="+", required=True, help="JSONL documents (bio-megatron data pubmed/pmc)")
    t.add_argument("--type", choices=["wordpiece", "bpe", "sentencepiece"], default="wordpiece",
                   help="wordpiece: BERT vocab.txt; bpe: RoBERTa/bio-lm byte-level BPE (<s> <pad> </s> <unk> ... "
                        "<mask>); sentencepiece: ALBERT's unigram spiece.model (<pad> <unk> [CLS] [SEP] [MASK])")
    t.add_argument("--output", default=None, help="vocab.txt (wordpiece) / a folder, default bpe_vocab (bpe) / "
                                                  "spiece.model (sentencepiece)")
    t.add_argument("--size", type=int, default=None,
                   help="tokens, specials included (wordpiece default 30000, paper: 30000, 50000; bpe default "
                        "50265 as roberta-base / bio-lm; sentencepiece default 30000 as ALBERT)")
    case = t.add_mutually_exclusive_group()
    case.add_argument("--cased", dest="uncased", action="store_false",
                      help="keep case (default, except for sentencepiece)")
    case.add_argument("--uncased", dest="uncased", action="store_true",
                      help="lower-case and strip accents (default for sentencepiece, as ALBERT)")
    t.set_defaults(uncased=None)
    t.add_argument("--model-type", choices=["bpe", "unigram"], default="bpe")
    t.add_argument("--max-sentences", type=int, default=5_000_000, help="sentences used for training")
    t.add_argument("--threads", type=int, default=2)
    t.set_defaults(func=_train)

    s = sub.add_parser("stats", help="entity words' sub-tokens per word (paper Table 3) and coverage")
    s.add_argument("--vocab", required=True, help="vocab.txt, or bert-base-cased / bert-base-uncased (bundled)")
    s.add_argument("--ner-file", nargs="+", required=True, help="IOB2 token<TAB>tag files, e.g. BC5CDR train.tsv")
    case = s.add_mutually_exclusive_group()
    case.add_argument("--lowercase", action="store_true")
    case.add_argument("--cased", action="store_true")
    s.set_defaults(func=_stats)
