"""``bio-megatron data``: download NCBI files, extract PubMed/PMC to JSONL, tokenize to .bin/.idx."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from bio_megatron.cli import data_download
from bio_megatron.utils.errors import DataError


def _expand(inputs: list[str], suffixes: tuple[str, ...]) -> list[str]:
    """Files as given, directories expanded to their matching files in name (publication) order."""
    out: list[str] = []
    for item in inputs:
        p = Path(item)
        try:
            is_dir = p.is_dir()
        except OSError as exc:  # e.g. a folder on the way that we may not enter: one line, not a traceback
            from bio_megatron.utils.input_files import os_error

            raise os_error(exc, p, reading=True) from None
        if is_dir:
            found = sorted(str(q) for q in p.rglob("*") if q.is_file() and q.name.endswith(suffixes))
            if not found:
                raise DataError(f"no {'/'.join(suffixes)} files in directory", str(p))
            out += found
        else:
            out.append(item)
    return out


def _print(obj: dict) -> None:
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")


def _download(args: argparse.Namespace) -> int:
    from bio_megatron.corpus import download as dl

    if args.source in data_download.DATASET_SOURCES:  # the public fine-tuning sets: their own module
        return data_download.run(args)
    if not args.out:
        raise DataError(f"data download {args.source} needs --out DIR")
    kw = dict(workers=args.workers, retries=args.retries, timeout=args.timeout)
    if args.source == "pubmed":
        baseline = args.baseline or not args.updates  # neither flag: the baseline
        res = dl.download_pubmed(args.out, baseline=baseline, updates=args.updates, limit=args.limit,
                                 base_url=args.base_url, **kw)
    else:
        res = dl.download_pmc(args.out, licence_groups=tuple(args.licence_group or ["oa_comm"]),
                              limit=args.limit, base_url=args.base_url, **kw)
    _print(res)
    return 0


def _pubmed(args: argparse.Namespace) -> int:
    from bio_megatron.corpus.pubmed import extract_pubmed

    _print(extract_pubmed(_expand(args.input, (".xml", ".xml.gz")), args.output, workers=args.workers))
    return 0


def _pmc(args: argparse.Namespace) -> int:
    from bio_megatron.corpus.pmc import extract_pmc

    inputs = _expand(args.input, (".nxml", ".xml", ".tar.gz"))
    _print(extract_pmc(inputs, args.output, workers=args.workers, licences=args.licence,
                       skip_bad=not args.strict))
    return 0


def _tokenize(args: argparse.Namespace) -> int:
    from bio_megatron.corpus.tokenize import tokenize_corpus
    from bio_megatron.vocab.builtin import resolve_vocab

    lowercase = True if args.lowercase else False if args.cased else None
    res = tokenize_corpus(_expand(args.input, (".jsonl",)), resolve_vocab(args.vocab), args.output_prefix,
                          workers=args.workers, lowercase=lowercase, shard_lines=args.shard_lines,
                          resume=not args.no_resume, json_keys=args.json_keys, encoder=args.encoder,
                          overwrite=args.overwrite, max_unk_rate=args.max_unk_rate)
    _print(res)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("data", help="download NCBI files; extract PubMed/PMC to JSONL; tokenize to .bin/.idx")
    sub = p.add_subparsers(dest="data_command", metavar="STEP", required=True)
    cpus = max(1, min(4, os.cpu_count() or 1))

    d = sub.add_parser("download", help="fetch PubMed baseline/update files or PMC OA bulk packages, verified")
    d.add_argument("source", choices=["pubmed", "pmc", *data_download.DATASET_SOURCES])
    d.add_argument("--out", help="directory for the downloaded files")
    d.add_argument("--baseline", action="store_true", help="PubMed yearly baseline (default)")
    d.add_argument("--updates", action="store_true", help="PubMed daily update files")
    d.add_argument("--licence-group", action="append", choices=["oa_comm", "oa_noncomm", "oa_other"],
                   help="PMC OA licence group(s); default oa_comm, the commercial-use subset the paper used")
    d.add_argument("--limit", type=int, default=None, help="at most N files per listing (for trials)")
    d.add_argument("--workers", type=int, default=4, help="parallel downloads")
    d.add_argument("--retries", type=int, default=4)
    d.add_argument("--timeout", type=float, default=60.0, help="seconds before a stalled connection is retried")
    d.add_argument("--base-url", default=os.environ.get("BIO_MEGATRON_NCBI_URL", "https://ftp.ncbi.nlm.nih.gov"),
                   help="NCBI server or a mirror (env BIO_MEGATRON_NCBI_URL)")
    data_download.add_arguments(d)
    d.set_defaults(func=_download)

    pm = sub.add_parser("pubmed", help="PubMed XML(.gz) -> JSONL (title + abstract sentences)")
    pm.add_argument("--input", nargs="+", required=True, help="files or directories, in publication order")
    pm.add_argument("--output", required=True, help="JSONL file to write")
    pm.add_argument("--workers", type=int, default=cpus)
    pm.set_defaults(func=_pubmed)

    pc = sub.add_parser("pmc", help="PMC JATS .nxml / bulk .tar.gz -> JSONL (body paragraphs, licence)")
    pc.add_argument("--input", nargs="+", required=True)
    pc.add_argument("--output", required=True)
    pc.add_argument("--workers", type=int, default=cpus)
    pc.add_argument("--licence", action="append", default=None,
                    help="keep only these licences ('CC BY', 'CC0', ... or 'commercial'); repeatable")
    pc.add_argument("--strict", action="store_true", help="stop at the first malformed article")
    pc.set_defaults(func=_pmc)

    t = sub.add_parser("tokenize", help="JSONL -> megatron-core indexed data <prefix>.bin/.idx")
    t.add_argument("--input", nargs="+", required=True, help="JSONL files or directories")
    t.add_argument("--vocab", required=True, help="WordPiece vocab.txt, or bert-base-cased / bert-base-uncased (bundled)")
    t.add_argument("--output-prefix", required=True)
    t.add_argument("--workers", type=int, default=cpus)
    case = t.add_mutually_exclusive_group()
    case.add_argument("--lowercase", action="store_true", help="force lower-casing (default: follow the vocab)")
    case.add_argument("--cased", action="store_true", help="never lower-case")
    t.add_argument("--shard-lines", type=int, default=2000, help="documents per resumable shard")
    t.add_argument("--no-resume", action="store_true", help="discard finished shards of an earlier run")
    t.add_argument("--overwrite", action="store_true",
                   help="replace <prefix>.bin/.idx not written by data tokenize, and write shards beside the files "
                        "of a <prefix>.shards/ folder that is not ours (files we did not write are never deleted)")
    t.add_argument("--max-unk-rate", type=float, default=0.05, metavar="RATE",
                   help="stop when more than this share of the tokens (0..1) is [UNK]: the vocabulary does not fit "
                        "the text (default 0.05; 1 disables the check)")
    t.add_argument("--encoder", choices=["auto", "tokenizers"], default="auto",
                   help="auto: flash-tokenizer for the printable-ASCII sentences of a WordPiece vocabulary (where its "
                        "ids equal the reference's), the Rust tokenizers for the rest; tokenizers: the reference "
                        "alone. The ids are the same either way")
    t.add_argument("--json-keys", nargs="+", default=None, metavar="KEY",
                   help="read Megatron-LM style JSONL ({\"text\": ...}, as tools/preprocess_data.py): the keys' "
                        "texts, in order, make one document, split into sentences here (default: our "
                        "'sentences' schema)")
    t.set_defaults(func=_tokenize)

    from bio_megatron.cli import data_convert  # the clinical releases' converters (their own module)

    data_convert.register(sub)
