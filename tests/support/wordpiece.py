"""The tests' BERT-style WordPiece tokenizer, trained on local text (the project's README),
with [CLS] ... [SEP] around each document, and the sentences the documents and embeddings
tests tokenize: one definition for tests/support/make_documents.py and make_embeddings.py (and
the embeddings bench's model, scripts/bench.d/embeddings_model.py)."""
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

MAX_LENGTH = 24
SENTENCES = [
    "vramfork serves TorchScript models over HTTP.",
    "Workers are recycled after a number of requests, without failing one.",
    "GPU",
    "Ünïcödé text, emoji 🚀 and 中文 are tokenized as Python does.",
    "A very long document " + "that goes on and on " * 12 + "until it is cut.",
]


def train(readme):
    """A WordPiece tokenizer of 800 tokens trained on the lines of `readme` (untruncated)."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    with open(readme, encoding="utf-8") as f:
        lines = [l for l in f.read().splitlines() if l.strip()]
    tok.train_from_iterator(lines, trainers.WordPieceTrainer(vocab_size=800, special_tokens=special))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tok.decoder = decoders.WordPiece()
    return tok


def save_pretrained(tok, folder, **kwargs):
    """`tok` as a Hugging Face fast tokenizer with its special tokens named, saved in `folder`
    (what transformers and sentence-transformers read); `kwargs` go to
    `PreTrainedTokenizerFast` (e.g. `model_max_length`)."""
    from transformers import PreTrainedTokenizerFast

    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                            pad_token="[PAD]", mask_token="[MASK]", **kwargs).save_pretrained(folder)
