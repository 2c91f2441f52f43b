# The mode (2, 3 or 4) faster than mode 0 on every fwd+bwd case in both rounds, by the smallest sum of times; prints it or 0
import json, glob, sys
out = sys.argv[1]
t = {}
for f in glob.glob(out + '/bk-mode*-*.json'):
    m, r = f.rsplit('bk-mode', 1)[1][:-5].split('-')
    for c in json.load(open(f))['cases']:
        if c['direction'] == 'fwd+bwd': t[(int(m), int(r), c['shape'])] = c['us']
shapes = sorted({k[2] for k in t})
best, bsum = 0, None
for m in (2, 3, 4):
    ok = all(t[(m, r, s)] < t[(0, r, s)] for r in (1, 2) for s in shapes)
    tot = sum(t[(m, r, s)] for r in (1, 2) for s in shapes)
    print('mode', m, 'faster everywhere' if ok else 'not', 'sum %.0f vs mode 0 %.0f' % (tot, sum(t[(0, r, s)] for r in (1, 2) for s in shapes)), file=sys.stderr)
    if ok and (bsum is None or tot < bsum): best, bsum = m, tot
print(best)
