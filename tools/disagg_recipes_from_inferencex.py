"""Build the `disagg_recipes` table of src/perfcast/serving/silicon_rules.yaml from git
clones of SemiAnalysisAI/InferenceX and NVIDIA/srt-slurm (a maintainer's tool; nothing
in perfcast runs it or reads those repositories).

    python tools/disagg_recipes_from_inferencex.py --inferencex DIR --srt-slurm DIR > block.yaml

For every revision of InferenceX's nvidia-master.yaml (.github/configs/, later configs/)
it reads the Dynamo + TRT-LLM disagg search spaces and their STP entries (no
speculative decoding). Each entry names its recipe either inline (PREFILL_MAX_BATCH_SIZE,
PREFILL_MAX_NUM_TOKENS, DECODE_MAX_BATCH_SIZE in `additional-settings`) or as a
CONFIG_FILE, read in every version of srt-slurm's history (all branches) and of the
copies InferenceX keeps under benchmarks/multi_node/srt-slurm-recipes/. A run is
written only when all of them agree on the decode `max_batch_size` and the recipe's
decode attention DP is the entry's; the prefill `max_batch_size` / `max_num_tokens` are
null where they differ. The client concurrency is the recipe's
`benchmark.concurrencies` where it gives one (the master's `conc-list` is a label there:
the H200 recipe `c4_ctx1_gen9_...` runs 36 clients), else the `conc-list`. Two layouts
of one deployment key with different decode slots are both left out.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import re
import subprocess
import sys

SYSTEMS = {"h100": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm", "b300": "b300_sxm",
           "gb200": "gb200", "gb300": "gb300"}
DSR1 = ["deepseek-ai/DeepSeek-R1-0528", "deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3"]
# model ids a space's rows may carry: the checkpoint the space names and, for DeepSeek,
# the architecture's id the public rows of these runs carry
MODELS = {"dsr1-fp8": DSR1, "dsr1-fp4": ["nvidia/DeepSeek-R1-0528-NVFP4-v2", *DSR1],
          "kimik2.5-fp4": ["nvidia/Kimi-K2.5-NVFP4", "moonshotai/Kimi-K2.5"],
          "gptoss-fp4": ["openai/gpt-oss-120b"]}
MASTER_PATHS = (".github/configs/nvidia-master.yaml", "configs/nvidia-master.yaml")
COPIES_AT = ("792d8aa4b", "HEAD")   # InferenceX revisions holding copies of the recipes


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True).stdout


def settings_of(doc: dict) -> tuple:
    """(decode max_batch_size, prefill max_batch_size, prefill max_num_tokens, decode
    attention DP, client concurrencies or None) of one recipe version."""
    trt = ((doc or {}).get("backend") or {}).get("trtllm_config") or {}
    pre, dec = trt.get("prefill") or {}, trt.get("decode") or {}
    bench = (doc.get("benchmark") or {}).get("concurrencies")
    if bench is None:
        conc = None
    elif isinstance(bench, (list, tuple)):
        conc = tuple(int(x) for x in bench)
    else:
        conc = tuple(int(x) for x in re.split(r"[x,\s]+", str(bench).strip()) if x)
    return (dec.get("max_batch_size"), pre.get("max_batch_size"), pre.get("max_num_tokens"),
            bool(dec.get("enable_attention_dp")), conc)


def main() -> None:
    import yaml

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inferencex", required=True)
    ap.add_argument("--srt-slurm", required=True)
    a = ap.parse_args()
    ix, ss = a.inferencex, a.srt_slurm

    @functools.lru_cache(None)
    def copies(rev: str) -> list[str]:
        return git(ix, "ls-tree", "-r", "--name-only", rev,
                   "benchmarks/multi_node/srt-slurm-recipes/").split()

    @functools.lru_cache(None)
    def recipe_versions(path: str) -> frozenset:
        path = path.replace("recipies/", "recipes/")   # a typo in some master revisions
        found = set()
        for h in git(ss, "log", "--all", "--format=%h", "--", path).split():
            text = git(ss, "show", f"{h}:{path}")   # empty where the commit deleted it
            if text:
                found.add(settings_of(yaml.safe_load(text)))
        parts = path.split("/")           # recipes, engine, hw, lengths, spec, file
        if len(parts) == 6:
            _, _, hw, seq, spec, name = parts
            for rev in COPIES_AT:
                for f in copies(rev):
                    if (f.endswith("/" + name) and f"/{hw}/" in f and f"/{spec}/" in f
                            and (f"/{seq}/" in f or seq.replace("k1k", "k/1k") in f)):
                        found.add(settings_of(yaml.safe_load(git(ix, "show", f"{rev}:{f}"))))
        return frozenset(found)

    def inline(settings) -> dict:
        out = {}
        for s in settings or ():
            m = re.match(r"\s*([A-Z_]+)=(\S+)", str(s))
            if m:
                out[m.group(1)] = m.group(2)
        return out

    revs = [r.split() for r in git(ix, "log", "--format=%h %ad", "--date=short", "--",
                                   *MASTER_PATHS).splitlines() if r]
    seen = collections.defaultdict(list)    # (space, isl, osl, C, pw, dw, d_adp) -> runs
    for n, (h, date) in enumerate(reversed(revs)):
        print(f"\r{n + 1}/{len(revs)} master revisions", end="", file=sys.stderr)
        text = next((t for p in MASTER_PATHS if (t := git(ix, "show", f"{h}:{p}"))), "")
        try:
            master = yaml.safe_load(text) or {}
        except yaml.YAMLError:
            continue
        for space, e in master.items():
            if (not isinstance(e, dict) or not e.get("disagg")
                    or "dynamo-trt" not in str(e.get("framework", ""))):
                continue
            for sl in e.get("seq-len-configs") or ():
                for entry in sl.get("search-space") or ():
                    if (entry.get("spec-decoding") or "none") != "none":
                        continue
                    pre, dec = entry.get("prefill") or {}, entry.get("decode") or {}
                    kv = {**inline(pre.get("additional-settings")),
                          **inline(dec.get("additional-settings"))}
                    d_adp = bool(dec.get("dp-attn"))
                    if "CONFIG_FILE" in kv:
                        versions, recipe = recipe_versions(kv["CONFIG_FILE"]), \
                            kv["CONFIG_FILE"].split("/", 2)[2]
                    else:
                        def num(k):
                            return int(kv[k]) if k in kv else None
                        versions = frozenset({(num("DECODE_MAX_BATCH_SIZE"),
                                               num("PREFILL_MAX_BATCH_SIZE"),
                                               num("PREFILL_MAX_NUM_TOKENS"), d_adp, None)})
                        recipe = "inline (master additional-settings)"
                    for c in entry.get("conc-list") or ():
                        seen[(space, sl["isl"], sl["osl"], c, pre.get("num-worker"),
                              dec.get("num-worker"), d_adp)].append(
                            (date, e.get("image"), e.get("model"), versions, recipe))
    print(file=sys.stderr)
    runs: dict = collections.defaultdict(dict)
    left_out = []
    for (space, isl, osl, c, pw, dw, d_adp), obs in seen.items():
        versions = set().union(*(o[3] for o in obs))
        decode = {v[0] for v in versions}
        concs = {v[4] for v in versions if v[4] is not None}
        if len(decode) != 1 or None in decode or any(v[3] != d_adp for v in versions) \
                or len(concs) > 1:
            left_out.append((space, isl, osl, c, pw, dw, d_adp))
            continue
        prefill = {v[1:3] for v in versions}
        prefill = prefill.pop() if len(prefill) == 1 and None not in next(iter(prefill)) \
            else (None, None)
        for run_c in (concs.pop() if concs else (c,)):
            key = (isl, osl, run_c, pw, dw, d_adp)
            run = runs[space].get(key)
            new = dict(decode=next(iter(decode)), prefill=prefill,
                       recipes={o[4] for o in obs}, dates={o[0] for o in obs},
                       images={o[1] for o in obs}, models={o[2] for o in obs})
            if run is None:
                runs[space][key] = new
            elif run != "conflict" and run["decode"] == new["decode"]:
                run["recipes"] |= new["recipes"]
                run["dates"] |= new["dates"]
                if run["prefill"] != new["prefill"]:
                    run["prefill"] = (None, None)
            else:
                runs[space][key] = "conflict"
    print("  disagg_recipes:")
    for space in sorted(runs):
        good = {k: v for k, v in runs[space].items() if v != "conflict"}
        if not good:
            continue
        family, hw = "-".join(space.split("-")[:2]), space.split("-")[2]
        dates = sorted(set().union(*(v["dates"] for v in good.values())))
        images = sorted({i.split("/")[-1] for v in good.values() for i in v["images"]})
        models = sorted(set().union(*(v["models"] for v in good.values())))
        source = (f"InferenceX nvidia-master.yaml {space} ({dates[0]} to {dates[-1]}; image "
                  f"{', '.join(images)}; model {', '.join(models)}); recipes NVIDIA/srt-slurm "
                  "recipes/ (every version) and InferenceX benchmarks/multi_node/"
                  "srt-slurm-recipes/")
        print(f"    {space}:")
        print(f"      models: [{', '.join(json.dumps(m) for m in MODELS[family])}]")
        print("      backend: trtllm")
        print(f"      systems: [{SYSTEMS[hw]}]")
        print(f"      precision: [{family.split('-')[1]}]")
        print(f"      source: {json.dumps(source)}")
        print("      runs:")
        for (isl, osl, c, pw, dw, d_adp), v in sorted(good.items()):
            pmbs, pmnt = ("null" if x is None else x for x in v["prefill"])
            recipe = " | ".join(sorted(v["recipes"]))
            print(f"        - [{isl}, {osl}, {c}, {pw}, {dw}, {str(d_adp).lower()}, "
                  f"{v['decode']}, {pmbs}, {pmnt}, {json.dumps(recipe)}]")
    print(f"{len(left_out)} entries left out (settings differ between versions)",
          file=sys.stderr)


if __name__ == "__main__":
    main()
