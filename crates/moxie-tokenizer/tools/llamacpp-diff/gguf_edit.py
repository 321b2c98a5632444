"""Rewrite a GGUF's metadata (tokenizer keys), keeping tensor infos and data."""
import struct, sys
T={0:'B',1:'b',2:'H',3:'h',4:'I',5:'i',6:'f',7:'?',10:'Q',11:'q',12:'d'}
class R:
    def __init__(s,b): s.b=b; s.p=0
    def rd(s,fmt):
        fmt='<'+fmt; n=struct.calcsize(fmt); v=struct.unpack_from(fmt,s.b,s.p); s.p+=n; return v[0]
    def rstr(s):
        n=s.rd('Q'); v=s.b[s.p:s.p+n].decode('utf-8'); s.p+=n; return v
    def rval(s,t):
        if t==8: return s.rstr()
        if t==9:
            at=s.rd('I'); n=s.rd('Q'); return (at,[s.rval(at) for _ in range(n)])
        return s.rd(T[t])
def wstr(x): b=x.encode('utf-8'); return struct.pack('<Q',len(b))+b
def wval(t,v):
    if t==8: return wstr(v)
    if t==9:
        at,items=v; return struct.pack('<IQ',at,len(items))+b''.join(wval(at,i) for i in items)
    return struct.pack('<'+T[t],v)
def load(path):
    b=open(path,'rb').read(); r=R(b)
    assert r.b[:4]==b'GGUF'; r.p=4; ver=r.rd('I'); nt=r.rd('Q'); nk=r.rd('Q')
    kv={}
    for _ in range(nk):
        k=r.rstr(); t=r.rd('I'); kv[k]=(t,r.rval(t))
    ti_start=r.p
    for _ in range(nt):
        r.rstr(); nd=r.rd('I'); r.p+=8*nd; r.rd('I'); r.rd('Q')
    ti_end=r.p
    align=kv.get('general.alignment',(4,32))[1]
    data_start=(ti_end+align-1)//align*align
    return dict(ver=ver,nt=nt,kv=kv,ti=b[ti_start:ti_end],data=b[data_start:],align=align)
def save(g,path):
    out=b'GGUF'+struct.pack('<IQQ',g['ver'],g['nt'],len(g['kv']))
    for k,(t,v) in g['kv'].items(): out+=wstr(k)+struct.pack('<I',t)+wval(t,v)
    out+=g['ti']
    a=g['align']; out+=b'\0'*((-len(out))%a)
    out+=g['data']
    open(path,'wb').write(out)
