//! The small built-in text the synthetic vocabulary's BPE merges are learned from: plain
//! English prose and a little Rust and Python, written for moxie (no third-party text).

pub const CORPUS: &str = r#"The quick brown fox jumps over the lazy dog. The dog was not amused, and the fox ran into the woods.
A model is a function from a sequence of tokens to a distribution over the next token. The engine reads the weights from a file, runs the layers one after another, and samples the next token from the logits.
Each layer has an attention block and a feed-forward block. In a mixture of experts, the feed-forward block is replaced by many small experts and a router that picks a few of them for every token.
The router computes one score per expert, keeps the top scores, and mixes the outputs of the chosen experts with weights that sum to one.
Most of the bytes of such a model are expert weights, but only a small part of them is read for each token, which is why these models are fast when the memory is large.
When the context grows, the attention cache grows with it. Multi-head latent attention stores a compressed latent vector instead of full keys and values, so the cache is much smaller.
The tokenizer splits the text into pieces: words, numbers, spaces and punctuation. Then it merges pairs of bytes that appear often together, again and again, until no merge applies.
This is how byte pair encoding works. It was first used to compress data, and later to build the vocabulary of language models.
It is a simple idea: count the pairs, merge the most frequent one, and repeat. The order of the merges is the rank that the tokenizer uses later.
In the morning the weather was cold and the streets were empty. By noon the sun came out, the air was warm, and people walked along the river.
She opened the window, made a cup of tea, and started to read the letter that had arrived the day before.
There are three things to remember: measure first, change one thing at a time, and write down what you find.
If the numbers do not match, look at the smallest example that still shows the problem, and compare it step by step with the reference.
The test passed on the first try, which was suspicious, so we ran it again with a different seed and it still passed.
Questions and answers: What is the capital of France? Paris. How many days are in a week? Seven. What is two plus two? Four.
Numbers like 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 42, 100, 256, 1024, 2048, 4096 and 65536 appear in code and in tables.
The year 2024 came after 2023, and the price went from 19.99 to 24.50 in a month.

fn main() {
    let numbers = vec![1, 2, 3, 4, 5];
    let total: i32 = numbers.iter().sum();
    println!("the total is {}", total);
    for (i, n) in numbers.iter().enumerate() {
        if n % 2 == 0 {
            println!("{} is even at index {}", n, i);
        } else {
            println!("{} is odd at index {}", n, i);
        }
    }
}

pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

pub struct Config {
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
}

impl Config {
    pub fn new(n_embd: usize, n_layer: usize, n_head: usize) -> Self {
        Self { n_embd, n_layer, n_head }
    }
}

def read_file(path):
    with open(path, "r") as f:
        return f.read()

def count_words(text):
    counts = {}
    for word in text.split():
        counts[word] = counts.get(word, 0) + 1
    return counts

class Tokenizer:
    def __init__(self, vocab, merges):
        self.vocab = vocab
        self.merges = merges

    def encode(self, text):
        tokens = []
        for word in text.split(" "):
            tokens.extend(self.encode_word(word))
        return tokens

    def decode(self, tokens):
        return "".join(self.vocab[t] for t in tokens)

if __name__ == "__main__":
    text = read_file("input.txt")
    for word, count in sorted(count_words(text).items()):
        print(word, count)

The user asked the assistant to explain the result, and the assistant answered with a short list of steps.
The system message sets the role of the assistant. The user message holds the question. The assistant message holds the answer.
Thank you for your help! You are welcome. Have a nice day, and see you tomorrow.
"#;
