// Differential harness: llama.cpp tokenization/detokenization of texts from a binary file.
#include "llama.h"
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>
#include <fstream>
#include <iterator>
#include <cstring>

static void hex(FILE*f, const char*p, int n){ for(int i=0;i<n;i++) fprintf(f,"%02x",(unsigned char)p[i]); }

int main(int argc, char**argv){
    if(argc<4){fprintf(stderr,"usage: tok model.gguf texts.bin out.txt\n");return 1;}
    llama_log_set([](ggml_log_level, const char*, void*){}, nullptr);
    llama_backend_init();
    auto mp = llama_model_default_params(); mp.vocab_only = true;
    llama_model* model = llama_model_load_from_file(argv[1], mp);
    if(!model){fprintf(stderr,"load failed\n");return 2;}
    const llama_vocab* vocab = llama_model_get_vocab(model);
    std::ifstream in(argv[2], std::ios::binary);
    std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    FILE* out = fopen(argv[3], "w");
    int nv = llama_vocab_n_tokens(vocab);
    fprintf(out, "V %d bos %d eos %d eot %d eom %d addbos %d addeos %d\n", nv, llama_vocab_bos(vocab), llama_vocab_eos(vocab), llama_vocab_eot(vocab), -1, (int)llama_vocab_get_add_bos(vocab), (int)llama_vocab_get_add_eos(vocab));
    fprintf(out, "EOG");
    for(int i=0;i<nv;i++) if(llama_vocab_is_eog(vocab,i)) fprintf(out," %d",i);
    fprintf(out, "\n");
    fprintf(out, "ATTR");
    for(int i=0;i<nv;i++) fprintf(out," %d",(int)llama_vocab_get_attr(vocab,i));
    fprintf(out, "\n");
    // pieces, special true/false
    for(int sp=0; sp<2; sp++){
        fprintf(out, "P%d", sp);
        for(int i=0;i<nv;i++){ char buf[512]; int n = llama_token_to_piece(vocab,i,buf,sizeof buf,0,sp); fprintf(out," "); if(n>0) hex(out,buf,n); else fprintf(out,"-"); }
        fprintf(out, "\n");
    }
    size_t pos=0; int idx=0;
    while(pos+4<=data.size()){
        uint32_t len; memcpy(&len,&data[pos],4); pos+=4;
        std::string text(&data[pos], len); pos+=len;
        fprintf(out,"T %d\n",idx++);
        for(int add=1; add>=0; add--) for(int parse=0; parse<2; parse++){
            std::vector<llama_token> ids(text.size()*2+16);
            int n = llama_tokenize(vocab, text.data(), text.size(), ids.data(), ids.size(), add, parse);
            if(n<0){ ids.resize(-n); n = llama_tokenize(vocab, text.data(), text.size(), ids.data(), ids.size(), add, parse);} 
            ids.resize(n);
            fprintf(out,"S %d %d", add, parse);
            for(auto t: ids) fprintf(out," %d",t);
            fprintf(out,"\n");
            for(int rs=0; rs<2; rs++) for(int us=0; us<2; us++){
                std::vector<char> buf(text.size()*4+1024);
                int m = llama_detokenize(vocab, ids.data(), ids.size(), buf.data(), buf.size(), rs, us);
                if(m<0){ buf.resize(-m); m = llama_detokenize(vocab, ids.data(), ids.size(), buf.data(), buf.size(), rs, us);} 
                fprintf(out,"D %d %d ", rs, us); hex(out, buf.data(), m); fprintf(out,"\n");
            }
        }
    }
    fclose(out);
    llama_model_free(model);
    return 0;
}
