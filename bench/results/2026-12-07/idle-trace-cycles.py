# Medians, over one idle benchmark's trace, of the stages of each idle
# submission: from the submitting goroutine's wake to its making the run
# goroutine runnable (run->send), from there to its blocking (send->block),
# and from there to the run goroutine's start (block->start).
# Usage: go tool trace -d=parsed t.out > t.txt; python3 idle-trace-cycles.py t.txt <submitter goroutine id>
import re,sys,statistics as st
f,sub=sys.argv[1],sys.argv[2]
ev=[]
for line in open(f):
    m=re.search(r' G=(-?\d+) StateTransition Time=(\d+) GoID=(\d+) (\w+)->(\w+)',line)
    if m: ev.append((int(m.group(2)),m.group(1),m.group(3),m.group(4),m.group(5)))
A=[];B=[];C=[];T=[]
i=0
cyc=None
for t,g,go,fr,to in ev:
    if go==sub and fr=='Runnable' and to=='Running' and cyc is None or (go==sub and fr=='Runnable' and to=='Running' and cyc is not None and cyc.get('blocked') is None and cyc.get('send') is None):
        cyc={'run':t}
    elif cyc is not None and g==sub and go!=sub and to=='Runnable' and 'send' not in cyc:
        cyc['send']=t
    elif cyc is not None and go==sub and to=='Waiting' and 'send' in cyc and 'blocked' not in cyc:
        cyc['blocked']=t
    elif cyc is not None and 'send' in cyc and go!=sub and fr=='Runnable' and to=='Running' and 'start' not in cyc:
        cyc['start']=t
        A.append(cyc['send']-cyc['run']); B.append(cyc.get('blocked',t)-cyc['send']); C.append(t-cyc.get('blocked',t)); T.append(t-cyc['run'])
        cyc=None
q=lambda x: "%.2f" % (st.median(x)/1000)
print(f, "n",len(A),"run->send",q(A),"send->block",q(B),"block->start",q(C),"total",q(T))
