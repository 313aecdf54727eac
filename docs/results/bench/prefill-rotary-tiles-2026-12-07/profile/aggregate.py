import collections, sys
lines=open(sys.argv[1]).read().splitlines()
c=collections.Counter(); tot=0
for l in lines:
    stack,_,n=l.rpartition(' '); n=int(n)
    fr=stack.split(';')
    if not any('gen_prof.py:3' in f for f in fr): continue
    py=[f for f in fr if '(esft/' in f or 'torch/' in f]
    tot+=n
    c[(py[-1][:70] if py else '?') + ('' if len(sys.argv) < 3 else ' || ' + fr[-1][:45])]+=n
for k,v in c.most_common(int(sys.argv[3]) if len(sys.argv)>3 else 30): print(v, round(100*v/tot,1), k)
print(tot)
