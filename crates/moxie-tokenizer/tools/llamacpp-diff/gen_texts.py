"""Texts for the llama.cpp differential check.

usage: gen_texts.py GOLDEN_TOKENIZER_JSON OUT_DIR  (writes texts.bin for the harness and texts.json)
"""
import json, random, struct, sys
random.seed(12345)
texts=[c['text'] for c in json.load(open(sys.argv[1]))]
specials=["<|endoftext|>","<|im_start|>","<|im_end|>","<｜begin▁of▁sentence｜>","<｜end▁of▁sentence｜>","<｜User｜>","<｜Assistant｜>","[gMASK]","<sop>","<|system|>","<|user|>","<|assistant|>","<|observation|>","<think>","</think>"]
pieces=[
 "a","b","Z","hello","World","the"," ","  ","   ","\t","\n","\r\n","\r","\n\n"," \n","\u00a0","\u3000","\u2028","\u0085","\u200b","\u202f",
 "'s","'S","'t","'re","'RE","'ve","'m","'ll","'LL","'d","'D","'x","’s",
 "0","7","12","123","1234","12345678","٣٤","²","½","Ⅻ",
 ".",",","!","?","...","--","->","==","(",")","[","]","{","}","<",">","/","\\","|","_","$","%","^","&","*","+","=","~","`","@","#",'"',"'",";",":",
 "é","ñ","ß","Å","İ","K","ﬁ","e\u0301","a\u0308","\u0301","\u0327",
 "Привет","мир","Ελληνικά","עברית","مرحبا","हिन्दी","क्षि","ภาษาไทย",
 "日本語","漢字","ひらがな","カタカナ","中文","你好","한국어","텍스트","ｈｅｌｌｏ","！","，","。","、","：",
 "🙂","😀","👍🏽","👨\u200d👩\u200d👧","❤️","🇯🇵","∑","∞","≠","€","£","©","™",
 "<|","|>"," <mask> ","<mask>","  <s>  ","</s>\n","<unk>","<think","think>","<|im_","[gMA","<sop","｜",
]+specials
def rnd_text(n):
    return ''.join(random.choice(pieces) for _ in range(n))
for i in range(400):
    texts.append(rnd_text(random.randint(1,40)))
for i in range(20):
    texts.append(rnd_text(random.randint(200,600)))
# whitespace-heavy
for i in range(40):
    texts.append(''.join(random.choice([" ","\t","\n","\r","\u00a0","\u3000","a","1","!"," x"]) for _ in range(random.randint(1,30))))
with open(sys.argv[2] + '/texts.bin','wb') as f:
    for t in texts:
        b=t.encode('utf-8'); f.write(struct.pack('<I',len(b))+b)
json.dump(texts, open(sys.argv[2] + '/texts.json','w'))
print(len(texts))
