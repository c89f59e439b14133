"""``datacentric prepare --pipeline DIR --media SOURCE --out DIR``: raw clips and captions
encoded by the pipeline's own VAE and text encoders into a ``latents:DIR`` folder."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from datacentric.cli.flag_groups import (
    add_json_flag,
    add_out_flag,
    add_world_flag,
    check_out_folder,
)
from datacentric.cli.flags import config_option
from datacentric.cli.ranks import announce, ranks_that_run, say
from datacentric.progress import counted
from datacentric.regular_files import open_regular


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "prepare",
        help="encode clips or images and their captions into latents:DIR with a "
        "diffusers pipeline's own VAE and text encoders",
        description="Decode each clip (PyAV) or image (Pillow) of --media, crop it to its "
        "bucket as the pipeline preprocesses, and write its VAE latents and its "
        "encode_prompt text embeddings in the layout latents:DIR reads for the family "
        "(Wan, SkyReels-V2, HunyuanVideo, Flux). Ranks share the clips by encoding cost; "
        "a stopped run resumes; skipped files are listed in OUT/prepare_report.json.",
    )
    parser.add_argument(
        "--pipeline",
        metavar="DIR",
        help="a diffusers pipeline folder (model_index.json; read with local files only, "
        "no code from it runs); required",
    )
    parser.add_argument(
        "--media",
        metavar="SOURCE",
        help="a CSV or JSONL of path,caption (Open-Sora's path,text accepted; paths "
        "relative to it), or a folder of clips/images with NAME.txt captions beside them; "
        "required",
    )
    add_out_flag(parser, note="here: the latents:DIR folder written")
    config_option(parser, key="bucket_config", note="here: each clip's size and frames")
    parser.add_argument(
        "--caption-rule",
        choices=("truncate", "skip", "error"),
        default="truncate",
        help="a caption longer than the text encoder takes: truncate (as the pipeline "
        "does, counted), skip, or error; missing or empty captions are skipped (error: "
        "refused) (default: truncate)",
    )
    parser.add_argument(
        "--max-text-tokens",
        type=int,
        default=None,
        metavar="N",
        help="text length, N >= 1 (default: the pipeline's own max_sequence_length)",
    )
    parser.add_argument(
        "--vae-tiling",
        action="store_true",
        help="encode with the VAE's tiling (large or long clips; values differ slightly)",
    )
    parser.add_argument(
        "--latent-dist",
        choices=("mode", "sample"),
        default="mode",
        help="what a latent file holds: mode (the VAE's mode, as the pipelines encode) or "
        "sample (its mean and log-variance: training draws each epoch's latent from them "
        "with the sample's generator) (default: mode)",
    )
    add_sampling_flags(parser)
    config_option(parser, key="seed", note="here: the bucket keep-probability draws")
    add_world_flag(parser, note="here: ranks encoding at once")
    config_option(parser, key="device", note="here: of the VAE and text encoders")
    add_json_flag(parser)
    parser.set_defaults(func=run)


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    """The frame-sampling flags (docs/prepare.md, "Frame sampling")."""
    group = parser.add_argument_group("frame sampling (videos; images keep their one frame)")
    number = {"type": int, "default": None, "metavar": "N"}
    group.add_argument(
        "--max-frames", **number, help="frames per sample at most, N >= 1 (default: no cap)"
    )
    group.add_argument(
        "--frame-stride",
        type=int,
        default=1,
        metavar="N",
        help="keep every N-th frame, after --target-fps (default: 1)",
    )
    group.add_argument(
        "--target-fps",
        type=float,
        default=None,
        metavar="FPS",
        help="resample frames to FPS: output frame i is the source frame nearest i/FPS "
        "seconds (default: each clip's own frames)",
    )
    group.add_argument(
        "--frame-extraction",
        choices=("head", "uniform", "slide", "chunk"),
        default=None,
        help="which frames make a sample: head (first; the default), uniform (spread "
        "over the clip; the default with --bucket-config), slide (--windows runs), chunk "
        "(back-to-back runs); slide and chunk give several samples per clip",
    )
    group.add_argument(
        "--windows", **number, help="samples per clip: slide (default 1), chunk (default: all)"
    )
    group.add_argument(
        "--window-stride",
        **number,
        help="frames between slide windows' starts (default: spread evenly over the clip)",
    )


def run(args: argparse.Namespace) -> int:
    # checked here, not by argparse: --world's deprecated aliases parse without them
    given = (("--pipeline DIR", args.pipeline), ("--media SOURCE", args.media))
    missing = [flag for flag, value in (*given, ("--out DIR", args.out)) if not value]
    if missing:
        raise ValueError(f"{', '.join(missing)}: required (see datacentric prepare --help)")
    check_out_folder(args.out)
    check_pipeline_folder(args.pipeline)  # these before torch and the first line
    check_media_flag(args.media)
    world = 1 if args.world is None else args.world
    announce(  # before torch and the pipeline load
        "prepare",
        f"encoding {args.media} with {args.pipeline}'s VAE and text encoders into {args.out} "
        f"on {counted(ranks_that_run(args.world), 'rank')}; reading the media first (each "
        "file's header), then what an earlier run left to encode",
        json_output=args.json,
    )
    from datacentric.prepare import PrepareJob, prepare
    from datacentric.prepare.plan import SAMPLING_KEYS

    job = PrepareJob(
        pipeline=args.pipeline,
        media=args.media,
        out=args.out,
        bucket_config=args.bucket_config,
        caption_rule=args.caption_rule,
        max_text_tokens=args.max_text_tokens,
        vae_tiling=args.vae_tiling,
        latent_dist=args.latent_dist,
        seed=0 if args.seed is None else args.seed,
        world=world,
        device=args.device,
        **{key: getattr(args, key) for key in SAMPLING_KEYS},
    )
    report = prepare(job)
    if args.json:
        print(json.dumps(report))
        return 0
    if "samples" not in report:
        return 0
    print(
        f"prepare: {counted(report['samples'], 'sample')} in {args.out} "
        f"({report['encoded']} encoded now, "
        f"{report['already_done']} already done, {report['skipped']} skipped: see "
        f"{args.out}/prepare_report.json)"
    )
    notes = [*pages_notes(report, args.out), dropped_note(report, args.media, args.out)]
    for note in filter(None, notes):
        say("prepare", note)
    return 0


#: the TIFFs of several pages named one a line at the end of a run; more are counted
PAGES_NAMED = 10


def pages_notes(report: dict, out: str) -> list[str]:
    """A note on each TIFF of several pages ``report`` lists (its first page alone is
    trained), the first :data:`PAGES_NAMED` by name and the others counted."""
    paged = report.get("pages_left_out") or []
    notes = [
        f"note: {entry['source']}: a TIFF of {entry['pages']} pages trains its first page "
        f"alone; page{'' if entry['pages'] == 2 else 's'} {entry['left_out']} "
        f"{'is' if entry['pages'] == 2 else 'are'} left out (split its pages into files, "
        "each with its caption, to train them)"
        for entry in paged[:PAGES_NAMED]
    ]
    if len(paged) > PAGES_NAMED:
        more = len(paged) - PAGES_NAMED
        notes.append(
            f"note: {counted(more, 'more TIFF')} of several pages "
            f"{'trains its' if more == 1 else 'train their'} first page alone: see "
            f"pages_left_out in {out}/prepare_report.json"
        )
    return notes


def check_pipeline_folder(folder: str) -> None:
    """``--pipeline``, refused in one line when it is no folder or holds no
    ``model_index.json`` (what its reading checks further needs torch)."""
    path = Path(folder).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(
            f"--pipeline {folder}: not a folder; name a diffusers pipeline folder "
            "(model_index.json, as save_pretrained writes it)"
        )
    if not (path / "model_index.json").is_file():
        raise ValueError(
            f"--pipeline {folder}: no model_index.json (a diffusers pipeline folder, as "
            "save_pretrained writes it)"
        )


#: the suffixes of a media list (``read_media_source`` reads a ``.json`` one too, and a
#: file of any other suffix as JSONL lines)
LIST_SUFFIXES = (".csv", ".jsonl", ".json")


def _binary(path: Path) -> bool:
    """Whether ``path``'s first bytes hold a NUL, as a clip's or an image's do and a text
    list's never do (but UTF-16/32 text, which starts with its byte-order mark)."""
    with open_regular(path, "rb") as handle:
        head = handle.read(4096)
    marks = (b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff")
    return b"\x00" in head and not head.startswith(marks)


def check_media_flag(media: str) -> None:
    """``--media``, refused in one line when it does not exist, is an empty folder, or is
    a file that is no list (a single clip or image); what its reading finds further is
    said after the first line."""
    path = Path(media).expanduser()
    if path.is_dir():
        if not any(path.iterdir()):
            raise ValueError(
                f"--media {media}: an empty folder; put clips or images in it, each with "
                "its caption in NAME.txt beside it, or name a .csv or .jsonl list"
            )
    elif not path.exists():
        raise ValueError(f"--media {media}: no such file or folder")
    elif path.is_file() and path.stat().st_size == 0:
        raise ValueError(f"--media {media}: an empty file; name a .csv or .jsonl list, or a folder")
    elif path.suffix.lower() not in LIST_SUFFIXES and _binary(path):
        raise ValueError(
            f"--media {media}: not a .csv or .jsonl list nor a folder; put a single clip "
            "or image in a folder with its caption in NAME.txt beside it, and name the folder"
        )


def dropped_note(report: dict, media: str, out: str) -> str | None:
    """The note on the samples of the manifest the last run wrote into ``out`` that this
    run of ``media`` no longer lists (``report``: :func:`~datacentric.prepare.run.prepare`'s);
    None where it lists them all."""
    count = report.get("no_longer_listed")
    if not count:
        return None
    earlier = report.get("earlier_media")
    earlier = None if earlier == media else earlier
    return (
        f"note: {counted(count, 'sample')} of the manifest the last run "
        f"wrote{f' (--media {earlier})' if earlier else ''} {'is' if count == 1 else 'are'} "
        f"not in --media {media}: {out}/manifest.jsonl lists this source's now, and latents:"
        f"{out} trains on them alone (their files stay in {out}/latents; "
        "prepare each source into its own --out to keep both)"
    )
