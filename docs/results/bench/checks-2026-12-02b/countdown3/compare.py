import json, sys
ref = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
new = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
ref = {r["iteration"]: r for r in ref if r["kind"] == "train"}
ok = True
for r in (r for r in new if r["kind"] == "train"):
    a = ref[r["iteration"]]
    same = all(a[k] == r[k] for k in ("fitness", "accuracy", "format_rate", "tokens_generated", "prompt_tokens", "finished_rate"))
    ok &= same
    print(r["iteration"], "same" if same else "DIFF", r["fitness"]["mean"], a["fitness"]["mean"], "update_norm ratio", r["update_norm"] / a["update_norm"])
print("ALL SAME" if ok else "DIFFERENT")
