#!/usr/bin/env python3
"""The ONNX importer on torchvision, Hugging Face and plain torch.nn models that are not fixtures.

tests/fixtures/exports holds 42 files the importer was built and tested on.
This check exports other torchvision classifiers with the same exporter
(Debian's PyTorch 1.13, opset 17, training mode, as make_exports.py does),
counts what PyTorch's autograd saves for each (make_exports.saved_bytes), and
plans each file with `dlplan plan --fusion eager`: the parameter count must
be PyTorch's exactly and the planned activations (memory_max, fp32, batch 1)
within 5 % of PyTorch's saved bytes. Each Hugging Face and user model then
trains one step on the CPU engine from its plan (micro-batch 2, --fusion
eager): a finite loss, and the measured peak the plan's. A file the
importer refuses must be one listed in REFUSED, with the start of its message. The default fusion's
figure is printed beside it. The Hugging Face families (small configs,
sequence 64, as make_exports.py's) need transformers on the path; the
ctest puts <build>/pydeps there (4.38.2, scripts/setup), and without it
they are skipped with a message. USER_MODELS are models a user writes with
torch.nn alone (a text classifier, torch's own TransformerEncoder, MLPs with
torch.nn's activations, a small CNN, a GroupNorm ResNet, U-Nets with nearest and
bilinear upsampling, and a ConvTranspose2d autoencoder). A family whose plan keeps opaque ops (no
engine trains them; docs/onnx.md) is held to the band in OPAQUE_BAND
instead: opaque ops keep every input, the conservative choice.

    /usr/bin/python3 tests/tools/beyond_fixtures.py --dlplan build/bin/dlplan [--work DIR] [NAME...]

Exit 77 (skip) without torch or torchvision.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")  # the exporter's, one per BatchNorm

try:
    import torch
    import torch.nn.functional as F
    import torchvision
except ImportError as e:
    print(f"SKIP: {sys.executable} cannot import torch and torchvision ({e}); Debian: apt-get install "
          "python3-torch python3-torchvision")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures", "exports"))
import make_exports  # noqa: E402  (export, saved_bytes: the fixtures' own recipe)
sys.path.insert(0, os.path.join(HERE, "..", "fixtures", "exports", "weights"))
import weighted_models  # noqa: E402  (the tutorial's PositionalEncoding model)

# name, constructor arguments, image side. None of these is a fixture.
MODELS = [
    ("alexnet", {}, 224),
    ("googlenet", {"aux_logits": False, "init_weights": True}, 224),
    ("inception_v3", {"aux_logits": False, "init_weights": True}, 299),
    ("mobilenet_v3_large", {}, 224),
    ("mnasnet1_0", {}, 224),
    ("shufflenet_v2_x0_5", {}, 224),
    ("squeezenet1_0", {}, 224),
    ("vgg16_bn", {}, 224),
    ("wide_resnet50_2", {}, 224),
    ("resnet34", {}, 224),
    ("resnet101", {}, 224),
    ("regnet_x_400mf", {}, 224),
    ("efficientnet_v2_s", {}, 224),
    ("densenet169", {}, 224),
    ("vit_b_32", {}, 224),
    ("maxvit_t", {}, 224),
    ("swin_s", {}, 224),
]

# name -> (transformers class, config class, config arguments): small
# configs; none of these families is a fixture.
SMALL = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512, vocab_size=1000,
             max_position_embeddings=128)
# An encoder-decoder family's sizes (SMALL's).
DECODER = dict(d_model=128, decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=512, encoder_layers=2,
               encoder_attention_heads=4, encoder_ffn_dim=512, vocab_size=1000, max_position_embeddings=128)
HF_MODELS = {
    "hf-distilbert": ("DistilBertForMaskedLM", "DistilBertConfig",
                      dict(dim=128, n_layers=2, n_heads=4, hidden_dim=512, vocab_size=1000,
                           max_position_embeddings=128)),
    "hf-electra": ("ElectraForMaskedLM", "ElectraConfig", dict(embedding_size=64, **SMALL)),
    "hf-roberta": ("RobertaForMaskedLM", "RobertaConfig", dict(pad_token_id=1, **SMALL)),
    "hf-opt": ("OPTForCausalLM", "OPTConfig",
               dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, ffn_dim=512, vocab_size=1000,
                    max_position_embeddings=128, word_embed_proj_dim=128, dropout=0.0)),
    "hf-gpt-neo": ("GPTNeoForCausalLM", "GPTNeoConfig",
                   dict(hidden_size=128, num_layers=2, num_heads=4, vocab_size=1000, max_position_embeddings=128,
                        attention_types=[[["global", "local"], 1]], window_size=32)),
    "hf-bloom": ("BloomForCausalLM", "BloomConfig", dict(hidden_size=128, n_layer=2, n_head=4, vocab_size=1000)),
    "hf-falcon": ("FalconForCausalLM", "FalconConfig",
                  dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=1000)),
    "hf-stablelm": ("StableLmForCausalLM", "StableLmConfig", dict(num_key_value_heads=4, **SMALL)),
    # Tried as a new user would after the ones above (this session's probe):
    "hf-gpt-bigcode": ("GPTBigCodeForCausalLM", "GPTBigCodeConfig",
                       dict(n_embd=128, n_layer=2, n_head=4, vocab_size=1000, n_positions=128)),
    "hf-mpt": ("MptForCausalLM", "MptConfig", dict(d_model=128, n_layers=2, n_heads=4, vocab_size=1000, max_seq_len=128)),
    "hf-xlm-roberta": ("XLMRobertaForMaskedLM", "XLMRobertaConfig", dict(pad_token_id=1, **SMALL)),
    "hf-megatron-bert": ("MegatronBertForMaskedLM", "MegatronBertConfig", dict(**SMALL)),
    "hf-persimmon": ("PersimmonForCausalLM", "PersimmonConfig", dict(**SMALL)),
    "hf-xglm": ("XGLMForCausalLM", "XGLMConfig",
                dict(d_model=128, num_layers=2, attention_heads=4, ffn_dim=512, vocab_size=1000,
                     max_position_embeddings=128)),
    "hf-gptj": ("GPTJForCausalLM", "GPTJConfig",
                dict(n_embd=128, n_layer=2, n_head=4, rotary_dim=16, vocab_size=1000, n_positions=128)),
    "hf-codegen": ("CodeGenForCausalLM", "CodeGenConfig",
                   dict(n_embd=128, n_layer=2, n_head=4, rotary_dim=16, vocab_size=1000, n_positions=128, n_ctx=128)),
    "hf-mobilebert": ("MobileBertForMaskedLM", "MobileBertConfig",
                      dict(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=128, embedding_size=64, intra_bottleneck_size=64, true_hidden_size=64,
                           max_position_embeddings=128)),
    "hf-roformer": ("RoFormerForMaskedLM", "RoFormerConfig", dict(embedding_size=128, **SMALL)),
    # XLM: its padding mask and lengths computed from the ids (ids != pad,
    # summed), its positions broadcast over the batch before the Add
    "hf-xlm": ("XLMWithLMHeadModel", "XLMConfig",
               dict(emb_dim=128, n_layers=2, n_heads=4, vocab_size=1000, max_position_embeddings=128)),
    # I-BERT in float mode: its LayerNorm written out in Python (x * weight +
    # bias: the bias is the IR's shift); GPT-NeoX-Japanese: learned output
    # biases expanded to the residual's shape and added after the projection
    "hf-ibert": ("IBertForMaskedLM", "IBertConfig", dict(pad_token_id=1, **SMALL)),
    "hf-gpt-neox-japanese": ("GPTNeoXJapaneseForCausalLM", "GPTNeoXJapaneseConfig",
                             dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=1000,
                                  max_position_embeddings=128)),
    # Position tables and masks over the 2^20 values the fold reads whole
    # (XGLM's sinusoidal table of 8,194 x 128, a Constant gathered at the
    # positions; GPT-Neo's causal-mask buffer of 2,048 x 2,048 a layer,
    # sliced to the sequence): only the elements a step takes are read.
    "hf-xglm-8k-positions": ("XGLMForCausalLM", "XGLMConfig",
                             dict(d_model=128, num_layers=2, attention_heads=4, ffn_dim=512, vocab_size=1000,
                                  max_position_embeddings=8192)),
    "hf-gpt-neo-2k-positions": ("GPTNeoForCausalLM", "GPTNeoConfig",
                                dict(hidden_size=128, num_layers=2, num_heads=4, vocab_size=1000,
                                     max_position_embeddings=2048, attention_types=[[["global", "local"], 1]],
                                     window_size=256)),
    # DeBERTa: its query and value biases, [D] parameters viewed per head
    # (transpose_for_scores(q_bias[None, None, :])), added after the heads
    # split; XSoftmax's masked fills, which fill nothing under the default
    # mask of ones; v1's LayerNorm written out in Python
    "hf-deberta": ("DebertaForMaskedLM", "DebertaConfig", dict(**SMALL)),
    "hf-deberta-v2": ("DebertaV2ForMaskedLM", "DebertaV2Config", dict(**SMALL)),
    # MPNet: T5's relative-position buckets computed in the graph (a log,
    # truncated), its table read at them once and added in every layer
    "hf-mpnet": ("MPNetForMaskedLM", "MPNetConfig", dict(**SMALL)),
    # T5's and UMT5's encoders (a head over the vocabulary added, as they
    # have none: the fourth field, the width it reads): T5's buckets computed
    # in the graph, the bias through a mask of zeros (T5: block 0's, read by
    # every block; UMT5: each block its own)
    "hf-t5-encoder": ("T5EncoderModel", "T5Config",
                      dict(vocab_size=1000, d_model=128, d_kv=32, d_ff=512, num_layers=2, num_heads=4), 128),
    "hf-umt5-encoder": ("UMT5EncoderModel", "UMT5Config",
                        dict(vocab_size=1000, d_model=128, d_kv=32, d_ff=512, num_layers=2, num_heads=4), 128),
    # ESM (protein language model): its GELU written in Python (x * 0.5 *
    # (1 + erf(x / sqrt 2))), which PyTorch's eager autograd runs op by op
    "hf-esm": ("EsmForMaskedLM", "EsmConfig",
               dict(pad_token_id=1, mask_token_id=2, **SMALL)),
    # More families a new user would try, first tried on 2026-12-07 (each
    # plans as it is: the BERT and GPT variants of the patterns above)
    "hf-ctrl": ("CTRLLMHeadModel", "CTRLConfig",
                dict(n_embd=128, n_layer=2, n_head=4, dff=512, vocab_size=1000, n_positions=128)),
    "hf-openai-gpt": ("OpenAIGPTLMHeadModel", "OpenAIGPTConfig",
                      dict(n_embd=128, n_layer=2, n_head=4, vocab_size=1000, n_positions=128)),
    "hf-biogpt": ("BioGptForCausalLM", "BioGptConfig", dict(**SMALL)),
    "hf-squeezebert": ("SqueezeBertForMaskedLM", "SqueezeBertConfig", dict(embedding_size=128, **SMALL)),
    "hf-rembert": ("RemBertForMaskedLM", "RemBertConfig",
                   dict(input_embedding_size=64, output_embedding_size=64, **SMALL)),
    "hf-ernie": ("ErnieForMaskedLM", "ErnieConfig", dict(**SMALL)),
    "hf-data2vec-text": ("Data2VecTextForMaskedLM", "Data2VecTextConfig", dict(pad_token_id=1, **SMALL)),
    "hf-camembert": ("CamembertForMaskedLM", "CamembertConfig", dict(pad_token_id=1, **SMALL)),
    "hf-bigbird": ("BigBirdForMaskedLM", "BigBirdConfig", dict(attention_type="original_full", **SMALL)),
    # LUKE without entity inputs: its word-only path is BERT's
    # (UNREAD_MODULES: the entity side)
    "hf-luke": ("LukeForMaskedLM", "LukeConfig", dict(entity_vocab_size=10, entity_emb_size=32, **SMALL)),
    # Tried on 2026-12-08. ConvBERT's separable convolution adds a learned
    # bias [C, 1] over [b, C, T] (a shift; with C = T it was read as a
    # position table [T, T], 4,032 parameters a layer too many), and its
    # span-based dynamic convolution (nn.Unfold as Gathers, a softmax over
    # the kernel axis of [b T H, k, 1]) is opaque (OPAQUE_BAND). ImageGPT
    # writes its layer norm as x / sqrt(mean(x^2) + eps) * weight.data: a
    # detached weight, which the exporter writes as a constant of ones and
    # PyTorch never trains (UNREAD_MODULES); its MLP's quick GELU,
    # x sigmoid(1.702 x), planned op by op.
    "hf-convbert": ("ConvBertForMaskedLM", "ConvBertConfig", dict(**SMALL)),
    "hf-imagegpt": ("ImageGPTForCausalImageModeling", "ImageGPTConfig",
                    dict(n_embd=128, n_layer=2, n_head=4, vocab_size=1001, n_positions=64)),
    # Tried on 2026-12-07: Flaubert (XLM's positions, expanded to [b, T]
    # before the table is read), LayoutLM (no bbox: its four box tables read
    # at row 0); and families refused today (REFUSED, below)
    # YOSO's expected-collision attention, 1 - acos(q k) / pi of normalized q and k
    "hf-yoso": ("YosoForMaskedLM", "YosoConfig", dict(**SMALL)),
    "hf-flaubert": ("FlaubertWithLMHeadModel", "FlaubertConfig",
                    dict(emb_dim=128, n_layers=2, n_heads=4, vocab_size=1000, max_position_embeddings=128)),
    "hf-layoutlm": ("LayoutLMForMaskedLM", "LayoutLMConfig", dict(**SMALL)),
    "hf-nezha": ("NezhaForMaskedLM", "NezhaConfig", dict(**SMALL)),
    "hf-funnel": ("FunnelForMaskedLM", "FunnelConfig",
                  dict(d_model=128, n_head=4, d_head=32, d_inner=512, block_sizes=[1, 1], vocab_size=1000)),
    "hf-nystromformer": ("NystromformerForMaskedLM", "NystromformerConfig", dict(num_landmarks=16, **SMALL)),
    "hf-rocbert": ("RoCBertForMaskedLM", "RoCBertConfig", dict(**SMALL)),
    "hf-xlnet": ("XLNetLMHeadModel", "XLNetConfig", dict(d_model=128, n_layer=2, n_head=4, d_inner=512, vocab_size=1000)),
    "hf-mra": ("MraForMaskedLM", "MraConfig", dict(**SMALL)),
    "hf-mixtral": ("MixtralForCausalLM", "MixtralConfig",
                   dict(num_local_experts=4, num_experts_per_tok=2, num_key_value_heads=2, **SMALL)),
    # The decoders of the encoder-decoder families as causal language models
    # (their *ForCausalLM): BART's learned positions from row 2, cast to the
    # embeddings' type; Marian's and Pegasus' fixed sinusoids (frozen
    # tables); Speech2Text2's fairseq sinusoids, padding row zero, gathered at
    # positions computed from the ids and reshaped; BigBird-Pegasus with full
    # attention. Their cross-attention is not read without an encoder
    # (UNREAD_MODULES).
    "hf-bart": ("BartForCausalLM", "BartConfig", DECODER),
    "hf-mbart": ("MBartForCausalLM", "MBartConfig", DECODER),
    "hf-plbart": ("PLBartForCausalLM", "PLBartConfig", DECODER),
    "hf-blenderbot": ("BlenderbotForCausalLM", "BlenderbotConfig", DECODER),
    "hf-blenderbot-small": ("BlenderbotSmallForCausalLM", "BlenderbotSmallConfig", DECODER),
    "hf-marian": ("MarianForCausalLM", "MarianConfig", dict(pad_token_id=1, decoder_start_token_id=1, **DECODER)),
    "hf-pegasus": ("PegasusForCausalLM", "PegasusConfig", DECODER),
    "hf-bigbird-pegasus": ("BigBirdPegasusForCausalLM", "BigBirdPegasusConfig",
                           dict(attention_type="original_full", **DECODER)),
    "hf-trocr": ("TrOCRForCausalLM", "TrOCRConfig",
                 dict(d_model=128, decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=512, vocab_size=1000,
                      max_position_embeddings=128)),
    "hf-speech2text2": ("Speech2Text2ForCausalLM", "Speech2Text2Config",
                        dict(d_model=128, decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=512,
                             vocab_size=1000, max_target_positions=128)),
}

# Hugging Face's vision models (image 64 x 64, ten classes), first tried on
# 2026-12-07: DeiT's class and distillation tokens; Swin's, SegFormer's and
# FocalNet's stochastic depth (drop_path, a RandomUniformLike a block, at
# their default rate 0.1); DINOv2's LayerScale; ResNet, RegNet and
# PoolFormer as Hugging Face writes them.
VIT = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512, image_size=64,
           patch_size=8, num_labels=10)
HF_VISION = {
    "hf-deit": ("DeiTForImageClassification", "DeiTConfig", VIT),
    "hf-vit-msn": ("ViTMSNForImageClassification", "ViTMSNConfig", VIT),
    "hf-dinov2": ("Dinov2ForImageClassification", "Dinov2Config",
                  dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=64, patch_size=8,
                       num_labels=10)),
    "hf-swin": ("SwinForImageClassification", "SwinConfig",
                dict(image_size=64, patch_size=4, embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=4,
                     num_labels=10)),
    "hf-segformer": ("SegformerForImageClassification", "SegformerConfig",
                     dict(num_encoder_blocks=2, depths=[2, 2], sr_ratios=[2, 1], hidden_sizes=[32, 64],
                          patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[4, 4],
                          num_labels=10)),
    "hf-focalnet": ("FocalNetForImageClassification", "FocalNetConfig",
                    dict(image_size=64, patch_size=4, embed_dim=32, depths=[2, 2], num_labels=10)),
    "hf-resnet": ("ResNetForImageClassification", "ResNetConfig",
                  dict(embedding_size=32, hidden_sizes=[32, 64], depths=[1, 1], num_labels=10)),
    "hf-regnet": ("RegNetForImageClassification", "RegNetConfig",
                  dict(embedding_size=32, hidden_sizes=[32, 64], depths=[1, 1], groups_width=16, num_labels=10)),
    # BEiT and Data2Vec-Vision: Swin's relative index with three rows for
    # the class token, a table a layer
    "hf-beit": ("BeitForImageClassification", "BeitConfig", dict(use_relative_position_bias=True, **VIT)),
    "hf-data2vec-vision": ("Data2VecVisionForImageClassification", "Data2VecVisionConfig",
                           dict(use_relative_position_bias=True, **VIT)),
    "hf-poolformer": ("PoolFormerForImageClassification", "PoolFormerConfig",
                      dict(depths=[2, 2], hidden_sizes=[32, 64], num_encoder_blocks=2, patch_sizes=[7, 3],
                           strides=[4, 2], padding=[2, 1], num_labels=10)),
    # Tried on 2026-12-07. MobileNets: TensorFlow's "same" padding, an F.pad
    # before each convolution (the IR's pad); ConvNeXt and ConvNeXt V2: their
    # channels-first LayerNorm written out (MERGED_BY_EXPORTER), V2's global
    # response normalization torch.norm over H and W (reduce_l2);
    # SwiftFormer's F.normalize, torch.sum over the tokens and repeat; the
    # rest refused (REFUSED).
    "hf-mobilenet-v1": ("MobileNetV1ForImageClassification", "MobileNetV1Config",
                        dict(image_size=64, depth_multiplier=0.25, num_labels=10)),
    "hf-mobilenet-v2": ("MobileNetV2ForImageClassification", "MobileNetV2Config",
                        dict(image_size=64, depth_multiplier=0.35, num_labels=10)),
    "hf-convnext": ("ConvNextForImageClassification", "ConvNextConfig",
                    dict(hidden_sizes=[32, 64], depths=[1, 1], num_stages=2, num_labels=10)),
    "hf-convnextv2": ("ConvNextV2ForImageClassification", "ConvNextV2Config",
                      dict(hidden_sizes=[32, 64], depths=[1, 1], num_stages=2, num_labels=10)),
    "hf-swiftformer": ("SwiftFormerForImageClassification", "SwiftFormerConfig",
                       dict(depths=[1, 1, 1, 1], embed_dims=[16, 32, 48, 64], num_labels=10)),
    "hf-swinv2": ("Swinv2ForImageClassification", "Swinv2Config",
                  dict(image_size=64, patch_size=4, embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=4,
                       num_labels=10)),
    "hf-bit": ("BitForImageClassification", "BitConfig",
               dict(embedding_size=32, hidden_sizes=[64, 128], depths=[1, 1], num_groups=8, num_labels=10)),
    "hf-pvt": ("PvtForImageClassification", "PvtConfig",
               dict(image_size=64, depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 64, 128],
                    num_attention_heads=[1, 2, 4, 8], num_labels=10)),
    # VAN's large-kernel attention: a depthwise 5 x 5, then a depthwise 7 x 7
    # dilated 3 (refused until conv2d had dilation, 2026-12-08)
    "hf-van": ("VanForImageClassification", "VanConfig",
               dict(hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_labels=10, image_size=64)),
    "hf-mobilevit": ("MobileViTForImageClassification", "MobileViTConfig",
                     dict(image_size=64, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 16, 24, 24, 32, 40, 160],
                          num_labels=10)),
}

# Encoder-decoders whole: two token inputs (input_ids, decoder_input_ids),
# the loss on the decoder's. T5's decoder adds its relative position bias
# through the causal mask; BART's, Marian's and Pegasus' logits add
# final_logits_bias (BUFFERS_PLANNED).
SEQ2SEQ_MODELS = {
    "hf-bart-seq2seq": ("BartForConditionalGeneration", "BartConfig", DECODER),
    "hf-marian-seq2seq": ("MarianMTModel", "MarianConfig", dict(pad_token_id=1, decoder_start_token_id=1, **DECODER)),
    "hf-pegasus-seq2seq": ("PegasusForConditionalGeneration", "PegasusConfig", DECODER),
    "hf-t5-seq2seq": ("T5ForConditionalGeneration", "T5Config",
                      dict(vocab_size=1000, d_model=128, d_kv=32, d_ff=512, num_layers=2, num_heads=4)),
}


# Models a user writes with torch.nn alone (the first thing a user tries):
# name -> (builder, input [batch 1], whether the input is token ids of a
# symbolic sequence length, exported at 64).
def _user_models():
    nn = torch.nn

    class TextClassifier(nn.Module):  # embedding, mean over the sequence, linear
        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Embedding(1000, 128), nn.Linear(128, 128)

        def forward(self, ids):
            return self.head(self.embed(ids).mean(1))

    class FirstToken(nn.Module):  # torch's own nn.TransformerEncoder, pre-norm, GELU; the first token classifies
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(1000, 64)
            self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(
                64, 4, 128, dropout=0.0, batch_first=True, norm_first=True, activation="gelu"), 2)
            self.head = nn.Linear(64, 5)

        def forward(self, ids):
            return self.head(self.encoder(self.embed(ids))[:, 0])

    class TokenTagger(nn.Module):  # post-norm nn.TransformerEncoder with dropout, a tag per token
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(1000, 64)
            self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1,
                                                                            batch_first=True), 2)
            self.head = nn.Linear(64, 1000)

        def forward(self, ids):
            return self.head(self.encoder(self.embed(ids)))

    # Linear(32, 1024), then an activation and Linear(1024, 1024) for each, and
    # 128 classes: every tensor a multiple of the GPU allocator's 512-byte
    # blocks, which the plan rounds to (a 64-wide MLP's 256-byte tensors would
    # each count double).
    def mlp(*acts):
        layers = [nn.Linear(32, 1024)]
        for a in acts:
            layers += [a, nn.Linear(1024, 1024)]
        return nn.Sequential(*layers, nn.Linear(1024, 128))

    class SmallCNN(nn.Module):  # conv-BN-ReLU, max pooling, adaptive pooling to 4 x 4, flatten, dropout, linear
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d((4, 4)), nn.Flatten(),
                nn.Dropout(0.5), nn.Linear(512, 10))

        def forward(self, x):
            return self.body(x)

    class PReLUCNN(nn.Module):  # nn.PReLU(16): one learned slope a channel ([C, 1, 1] in the graph)
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.PReLU(16), nn.Conv2d(16, 16, 3, padding=1),
                                      nn.PReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))

        def forward(self, x):
            return self.body(x)

    # A 1-D signal (audio, a time series): Conv1d, BatchNorm1d, ReLU,
    # MaxPool1d, a strided Conv1d, AdaptiveAvgPool1d; 128 channels and 128
    # classes so that every tensor is a multiple of 512 bytes, as the MLPs'.
    class Conv1dNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv1d(1, 128, 5, padding=2), nn.BatchNorm1d(128), nn.ReLU(),
                                      nn.MaxPool1d(2), nn.Conv1d(128, 128, 3, stride=2, padding=1), nn.ReLU(),
                                      nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(128, 128))

        def forward(self, x):
            return self.body(x)

    class TCN(nn.Module):
        # Bai et al. 2018's temporal convolution network (without weight
        # norm): causal dilated Conv1d layers, padded (k - 1) d with the tail
        # cut off, residual; the head reads the last step
        def __init__(self):
            super().__init__()
            self.inp, self.head = nn.Conv1d(1, 32, 1), nn.Linear(32, 128)
            self.convs = nn.ModuleList([nn.Conv1d(32, 32, 3, padding=2 * d, dilation=d) for d in (1, 2, 4, 8)])

        def forward(self, x):
            h = self.inp(x)
            for conv, d in zip(self.convs, (1, 2, 4, 8)):
                h = h + F.relu(conv(h)[:, :, :-2 * d])
            return self.head(h[:, :, -1])

    class ASPP(nn.Module):  # DeepLab v3's atrous spatial pyramid pooling, over a stride-2 stem
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU())
            self.branches = nn.ModuleList([nn.Conv2d(32, 16, 1)] +
                                          [nn.Conv2d(32, 16, 3, padding=r, dilation=r) for r in (2, 4, 6)])
            self.project = nn.Sequential(nn.Conv2d(64, 32, 1), nn.BatchNorm2d(32), nn.ReLU())
            self.head = nn.Linear(32, 128)

        def forward(self, x):
            x = self.stem(x)
            return self.head(self.project(torch.cat([b(x) for b in self.branches], 1)).mean((2, 3)))

    class UNet(nn.Module):  # two levels down and up: GroupNorm, nearest (or bilinear) upsampling, skips concatenated
        def __init__(self, mode="nearest"):
            super().__init__()
            self.mode = mode
            def block(cin, cout):
                return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU(),
                                     nn.Conv2d(cout, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU())
            self.e1, self.e2, self.mid = block(3, 32), block(32, 64), block(64, 128)
            self.d2, self.d1 = block(128 + 64, 64), block(64 + 32, 32)
            self.up = nn.Upsample(scale_factor=2, mode=mode, **({"align_corners": True} if mode != "nearest" else {}))
            self.head = nn.Linear(32, 128)

        def forward(self, x):
            s1 = self.e1(x)
            s2 = self.e2(F.max_pool2d(s1, 2))
            h = self.mid(F.max_pool2d(s2, 2))
            h = self.d2(torch.cat([self.up(h), s2], 1))
            h = self.d1(torch.cat([F.interpolate(h, scale_factor=2.0, mode=self.mode), s1], 1))
            return self.head(h.mean((2, 3)))

    class ConvAutoencoder(nn.Module):  # strided convolutions down, nn.ConvTranspose2d up (output_padding), BN
        def __init__(self):
            super().__init__()
            def down(cin, cout):
                return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=2, padding=1), nn.BatchNorm2d(cout), nn.ReLU())
            def up(cin, cout):
                return nn.Sequential(nn.ConvTranspose2d(cin, cout, 3, stride=2, padding=1, output_padding=1),
                                     nn.BatchNorm2d(cout), nn.ReLU())
            self.encode = nn.Sequential(down(3, 32), down(32, 64), down(64, 128))
            self.decode = nn.Sequential(up(128, 64), up(64, 32), nn.ConvTranspose2d(32, 16, 4, stride=2, padding=1))
            self.head = nn.Linear(16, 128)

        def forward(self, x):
            return self.head(torch.tanh(self.decode(self.encode(x))).mean((2, 3)))

    class LSTMClassifier(nn.Module):
        def __init__(self, layers=1, bidirectional=False, cell=nn.LSTM):
            super().__init__()
            self.embed = nn.Embedding(1000, 32)
            self.rnn = cell(32, 32, num_layers=layers, batch_first=True, bidirectional=bidirectional)
            self.head = nn.Linear(64 if bidirectional else 32, 5)

        def forward(self, ids):
            return self.head(self.rnn(self.embed(ids))[0][:, -1])

    def ids():
        return torch.randint(0, 1000, (1, 64))

    return {
        "user-text-classifier": (TextClassifier, ids, True),
        "user-torch-encoder-cls": (FirstToken, ids, True),
        "user-torch-encoder-tagger": (TokenTagger, ids, True),
        # PyTorch's nn.Transformer tutorial, batch first: its PositionalEncoding
        # (pe: 1,024 floats, which the recipe's stripping keeps), dropout 0.1
        "user-tutorial-transformer": (lambda: weighted_models.TinyPosEnc(d=16, max_len=64, vocab=1000, heads=2,
                                                                         dropout=0.1), ids, True),
        # the same at the tutorial's own size: d 512, pe of 5,000 positions
        # (2,560,000 floats, over the 2^20 the fold reads whole)
        "user-tutorial-transformer-d512": (lambda: weighted_models.TinyPosEnc(d=512, max_len=5000, vocab=1000,
                                                                              heads=8, ff=512, dropout=0.1), ids, True),
        "user-mlp-leaky-relu": (lambda: mlp(nn.LeakyReLU(0.1), nn.LeakyReLU()), lambda: torch.randn(1, 32), False),
        "user-mlp-elu-softplus-mish": (lambda: mlp(nn.ELU(), nn.Softplus(), nn.Mish(), nn.Tanh()),
                                       lambda: torch.randn(1, 32), False),
        "user-small-cnn": (SmallCNN, lambda: torch.randn(1, 3, 32, 32), False),
        "user-conv1d": (Conv1dNet, lambda: torch.randn(1, 1, 64), False),
        # dilated convolutions: a TCN's causal Conv1d and DeepLab's ASPP
        "user-tcn": (TCN, lambda: torch.randn(1, 1, 64), False),
        "user-aspp": (ASPP, lambda: torch.randn(1, 3, 32, 32), False),
        "user-mlp-prelu": (lambda: mlp(nn.PReLU()), lambda: torch.randn(1, 32), False),
        "user-cnn-prelu": (PReLUCNN, lambda: torch.randn(1, 3, 32, 32), False),
        # torchvision's ResNet-18 with nn.GroupNorm(32, C) for every BatchNorm,
        # as detection backbones train it (Wu & He 2018)
        "user-resnet18-groupnorm": (lambda: torchvision.models.resnet18(
            weights=None, norm_layer=lambda c: nn.GroupNorm(32, c)), lambda: torch.randn(1, 3, 224, 224), False),
        "user-unet": (UNet, lambda: torch.randn(1, 3, 64, 64), False),
        # the same with bilinear upsampling, align_corners=True and False
        "user-unet-bilinear": (lambda: UNet("bilinear"), lambda: torch.randn(1, 3, 64, 64), False),
        "user-conv-autoencoder": (ConvAutoencoder, lambda: torch.randn(1, 3, 64, 64), False),
        "user-lstm": (LSTMClassifier, ids, True),
        "user-lstm-3-layers": (lambda: LSTMClassifier(layers=3), ids, True),
        "user-bilstm": (lambda: LSTMClassifier(bidirectional=True), ids, True),
        "user-gru": (lambda: LSTMClassifier(layers=2, bidirectional=True, cell=nn.GRU), ids, True),
        "user-rnn": (lambda: LSTMClassifier(layers=2, cell=nn.RNN), ids, True),
    }


USER_MODELS = _user_models()

# Refused today, with the start of the message after "<file>: ". (MaxViT,
# whose attention is an Einsum ONNX shape inference left unknown, was here
# until the importer read such an Einsum as a MatMul. RoBERTa, whose
# positions are computed from the token ids, was here until the importer
# evaluated them assuming no padding token. GPT-J and CodeGen, whose
# interleaved rotary tables are repeat_interleave'd by a Loop and split from
# one gathered table, were here until the importer rewrote that Loop, folded
# GatherElements and Split, and planned the rotation as the IR's interleaved
# rope. RoFormer, whose rotary sines and cosines are gathered from a
# frozen parameter, was here until the importer read a table of fixed
# sinusoidal positions as constants.) MobileBERT's head multiplies by a
# weight concatenated in the graph (Transpose of the embedding, Concat); and
# Mixtral's ONNX routing (OneHot, per-expert index lists) is no IR op:
# a Mixtral config.json plans and trains through the moe_* ops instead
# (docs/huggingface.md).
REFUSED = {
    "hf-mixtral": "node '/inner/model/layers.0/block_sparse_moe/OneHot' (OneHot): op 'OneHot' is not supported",
    # (MobileBERT was here until its head weight cat([E^T, W]) became two IR
    # `parameter`s, a transpose and a concat computed once per step; PVT until
    # its position table, reshaped and interpolated, did too.)
    # Tried on 2026-12-07. Tensors without the batch axis computed from
    # constants or parameter views: Nezha's and Funnel's relative position encodings (Nezha's
    # transposed to put the positions first), Swin V2's logit scale and its
    # continuous position bias, BiT's standardized convolution weights, PVT's
    # position embeddings interpolated to the image; XLNet puts the sequence
    # before the batch; Nystromformer's identity (EyeLike); RoCBert's shape and
    # pronunciation rows, one row concatenated to every token; MRA's
    # block-sparse attention. (MobileViT, which folds its patches into the
    # batch, was here until an attention over [b P, N, C] was left unfused.)
    "hf-nezha": "node '/inner/nezha/encoder/layer.0/attention/self/Transpose_3' (Transpose): perm [1, 0, 2, 3] "
                "moves the batch axis",
    "hf-funnel": "node '/inner/funnel/encoder/sin_dropout/Dropout' (Dropout): has no data input",
    "hf-swinv2": "node '/inner/swinv2/encoder/layers.0/blocks.0/attention/self/continuous_position_bias_mlp/"
                 "continuous_position_bias_mlp.0/MatMul' (MatMul): multiplies constant tensor",
    "hf-bit": "node '/inner/bit/embedder/convolution/Conv' (Conv): its weight "
              "'/inner/bit/embedder/convolution/Reshape_2_output_0' is computed in the graph from parameters",
    "hf-xlnet": "node '/inner/transformer/Transpose' (Transpose): perm [1, 0] moves the batch axis",
    "hf-nystromformer": "node '/inner/nystromformer/encoder/layer.0/attention/self/EyeLike' (EyeLike): op 'EyeLike' "
                        "is not supported",
    "hf-rocbert": "node '/inner/roc_bert/embeddings/Concat_1' (Concat): input "
                  "'/inner/roc_bert/embeddings/shape_embed/Gather_output_0' is not something dlplan can plan",
    "hf-mra": "node '/inner/mra/encoder/layer.0/attention/output/dense/MatMul' (MatMul): multiplies constant "
              "tensor '/inner/mra/encoder/layer.0/attention/self/Reshape_2_output_0' by parameters",
    # (nn.LSTM's classifiers were here until the IR had lstm.)
}

# Planned with opaque ops (kept inputs: more than PyTorch keeps), and not
# trainable (Falcon was here until its key and value Gathers became slices
# and its RoPE the IR's rope). (low, high) error.
OPAQUE_BAND = {
    # ConvBERT's span-based dynamic convolution: nn.Unfold exported as two
    # Gathers of constant indices, and a softmax over a middle axis, opaque
    "hf-convbert": (0.10, 0.18),
    # (SwiftFormer, +11.5 %, and ConvNeXt V2, -4.5 %, were here until F.normalize,
    # torch.sum, Tensor.repeat and torch.norm became reduce_l2, a one-sided
    # clip, an Expand the Div broadcasts, reduce_sum and an upsample.)
    # (XGLM's sinusoidal positions, an Add of a constant, were here until
    # they became the IR's pos_embedding with `sinusoidal`.)
}

# Families whose batch-1 count holds a storage a larger batch does not
# (make_exports.py's AT_BATCH_2, GPT-NeoX's case): CodeGen's value is a
# permuted slice of its fused qkv_proj output, which matmul's reshape at
# batch 1 leaves a view, so bmm keeps the whole projection (-7.0 % against
# the batch-1 count; GPT-NeoX-Japanese, as GPT-NeoX: -8.8 %). They are held to
# PyTorch's bytes per sample at batch 2.
# DeBERTa's keys are a chunk of its fused in_proj output, permuted per head,
# which at batch 1 bmm keeps whole (three times the keys: -5.0 % against
# the batch-1 count).
AT_BATCH_2 = {"hf-codegen", "hf-gpt-neox-japanese", "hf-deberta"}

# Bytes PyTorch's eager forward computes and keeps that the exported file
# does not compute: DebertaLayerNorm (v1) writes `hidden_states - mean` twice
# (once for the variance, once normalised), and PyTorch keeps both, pow's
# input and div's; torch.onnx.export's common-subexpression pass merged the
# two in 4 of the 5 layer norms of this file, so the file has, and dlplan
# plans, one [T, D] fp32 tensor fewer in each: 4 x 64 x 128 x 4 B. The
# planned activations are held to PyTorch's bytes less these.
# Hugging Face's ConvNeXt and ConvNeXt V2 write their channels-first
# LayerNorm (the stem's and the downsampling layer's) the same way, x - u
# twice, merged alike: one [32, 16, 16] fp32 tensor fewer in each of the two.
MERGED_BY_EXPORTER = {"hf-deberta": 4 * 64 * 128 * 4, "hf-convnext": 2 * 32 * 16 * 16 * 4,
                      "hf-convnextv2": 2 * 32 * 16 * 16 * 4}

# Parameters an opaque op holds, which the plan does not count (the notes say
# so). (nn.PReLU's slope was one until PRelu became the IR's prelu.)
PARAMS_LEFT_OUT = {}

# Modules whose parameters the exported forward never reads, so the file
# does not hold them: ESM's contact-prediction head (EsmForMaskedLM builds it,
# its logits do not use it), and the cross-attention of a decoder run as a
# causal language model (no encoder states to attend to). Their parameters
# (names holding one of these) are left out of PyTorch's count.
CROSS_ATTENTION = [".encoder_attn.", ".encoder_attn_layer_norm."]
# LUKE's entity side (entity embeddings, the entity-aware queries w2e, e2w
# and e2e of every layer, the entity head) is read only with entity inputs,
# and its pooler not by the logits.
UNREAD_MODULES = {"hf-esm": ["inner.esm.contact_head."],
                  "hf-luke": ["inner.luke.entity_embeddings.", ".w2e_query.", ".e2w_query.", ".e2e_query.",
                              "inner.luke.pooler.", "inner.entity_predictions."],
                  # DINOv2's mask token, read only with bool_masked_pos
                  "hf-dinov2": ["inner.dinov2.embeddings.mask_token"],
                  # a pooler the masked-LM logits do not read
                  "hf-squeezebert": ["inner.transformer.pooler."], "hf-bigbird": ["inner.bert.pooler."],
                  "hf-layoutlm": ["inner.layoutlm.pooler."],
                  # VanModel builds a final LayerNorm its pooled output never reads
                  "hf-van": ["inner.van.layernorm."],
                  # layer norms multiplying by weight.data: constants to the
                  # exporter (ones), never trained by PyTorch
                  "hf-imagegpt": [".ln_1.", ".ln_2.", "inner.transformer.ln_f."],
                  **{name: CROSS_ATTENTION for name in
                     ["hf-bart", "hf-mbart", "hf-plbart", "hf-blenderbot", "hf-blenderbot-small", "hf-marian",
                      "hf-pegasus", "hf-bigbird-pegasus", "hf-trocr", "hf-speech2text2"]}}

# Buffers the plan counts as parameters: ONNX holds a buffer as any other
# initializer, and one the graph adds to an activation is planned as a
# trained bias (the IR's shift). BART's, Marian's and Pegasus'
# final_logits_bias, added to the logits, is a buffer of zeros in
# transformers; the plan counts (and trains) its vocabulary-sized values.
BUFFERS_PLANNED = {name: ["inner.final_logits_bias"]
                   for name in ["hf-bart-seq2seq", "hf-marian-seq2seq", "hf-pegasus-seq2seq"]}

# Bytes the exported ops keep that PyTorch's eager run does not, because the
# model computes them inside a custom torch.autograd.Function, whose forward
# runs without autograd and saves only what its own backward asks for: YOSO's
# YosoCumulation keeps the expectation and q, k, v, where the traced ops
# (acos of q k^T, then (1 - acos / pi)^tau) keep acos's input and pow's,
# two [4, 64, 64] fp32 tensors a layer. dlplan trains the traced ops (the
# same math), measured as planned; held to PyTorch's bytes plus these.
CUSTOM_FUNCTIONS = {"hf-yoso": 2 * 2 * 4 * 64 * 64 * 4}

# Bytes the plan keeps as a copy where PyTorch keeps a view: the IR's
# transpose is a contiguous copy, but a permute followed by a reshape that
# only splits an axis stays a view of the permuted storage. PVT's spatial
# reduction feeds its convolution hidden.permute(0, 2, 1).reshape(b, C, H, W),
# a view of the LayerNorm output the query projection keeps already; the
# plan keeps the [C, H W] copy too, at each stage with sr_ratio > 1
# (16 x 256, 32 x 64 and 64 x 16 fp32). Held to PyTorch's bytes plus these.
PERMUTED_VIEWS = {"hf-pvt": (16 * 256 + 32 * 64 + 64 * 16) * 4}

# Frozen parameters (requires_grad False) whose values are fixed sinusoidal
# positions: the importer reads them as constants (the note names each), so
# the plan counts PyTorch's trained parameters. RoFormer's position table
# (make_exports.py keeps frozen parameters' data).
FIXED_TABLES = {"hf-roformer", "hf-marian", "hf-pegasus", "hf-speech2text2", "hf-marian-seq2seq",
                "hf-pegasus-seq2seq"}


def record(name, model, inputs, names, axes, loss, work):
    """PyTorch's parameters and saved bytes for one forward + loss, and the
    file torch.onnx.export writes (make_exports.py's recipe)."""
    model.train()
    saved = make_exports.saved_bytes(model, inputs, loss)
    if name in AT_BATCH_2:
        saved["saved_bytes_with_loss_mask_dropout"] = make_exports.saved_bytes_at_batch_2(model, inputs)[
            "saved_bytes_with_loss_mask_dropout_per_sample_at_batch_2"]
    params = sum(p.numel() for p in model.parameters())
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    path = os.path.join(work, f"{name}.onnx")
    # A user's file holds its buffers (the tutorial's pe): kept whatever
    # their size, as frozen parameters are.
    make_exports.export(model, inputs, names, axes, path, 17, keep={n for n, _ in model.named_buffers()})
    return path, (params, frozen), saved["saved_bytes_with_loss_mask_dropout"]


def export(name, kwargs, side, work):
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None, **kwargs)
    for m in model.modules():  # PyTorch 1.13 cannot export the Bernoulli in training mode
        if isinstance(m, torchvision.ops.StochasticDepth):
            m.p = 0.0
    target = torch.tensor([3])
    return record(name, model, [torch.randn(1, 3, side, side)], ["input"],
                  {"input": {0: "batch"}, "output": {0: "batch"}}, lambda y: F.cross_entropy(y, target), work)


class EncoderHead(torch.nn.Module):
    """An encoder's hidden states read by a linear head over the vocabulary."""

    def __init__(self, inner, width, vocab=1000):
        super().__init__()
        self.inner, self.head = inner, torch.nn.Linear(width, vocab)

    def forward(self, x):
        return self.head(self.inner(x, return_dict=False)[0])


def export_hf(name, work):
    import transformers
    model_class, config_class, kwargs, *head = HF_MODELS[name]
    torch.manual_seed(0)
    inner = getattr(transformers, model_class)(getattr(transformers, config_class)(**kwargs))
    model = EncoderHead(inner, head[0]) if head else make_exports.Logits(inner)
    ids = torch.randint(0, 1000, (1, 64))
    path, (params, frozen), saved = record(
        name, model, [ids], ["input_ids"], {"input_ids": {0: "batch", 1: "sequence"}, "output": {0: "batch", 1: "sequence"}},
        lambda y: F.cross_entropy(y.reshape(-1, y.shape[-1]), ids.reshape(-1)), work)
    return path, (params - unread_parameters(name, model), frozen), saved


def unread_parameters(name, model):
    """The parameters of `name`'s UNREAD_MODULES: not in the file."""
    return sum(p.numel() for n, p in model.named_parameters()
               if any(part in n for part in UNREAD_MODULES.get(name, [])))


class Seq2Seq(torch.nn.Module):
    """An encoder-decoder's logits from the source's and the decoder's tokens."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x, y):
        return self.inner(input_ids=x, decoder_input_ids=y, return_dict=False)[0]


def export_seq2seq(name, work):
    import transformers
    model_class, config_class, kwargs = SEQ2SEQ_MODELS[name]
    torch.manual_seed(0)
    model = Seq2Seq(getattr(transformers, model_class)(getattr(transformers, config_class)(**kwargs)))
    x, y = torch.randint(2, 1000, (1, 64)), torch.randint(2, 1000, (1, 64))
    axes = {n: {0: "batch", 1: "sequence"} for n in ["input_ids", "decoder_input_ids", "output"]}
    path, (params, frozen), saved = record(
        name, model, [x, y], ["input_ids", "decoder_input_ids"], axes,
        lambda o: F.cross_entropy(o.reshape(-1, o.shape[-1]), y.reshape(-1)), work)
    buffers = dict(model.named_buffers())
    planned = sum(buffers[b].numel() for b in BUFFERS_PLANNED.get(name, []))
    buffers_planned[name] = planned
    return path, (params + planned, frozen), saved


buffers_planned = {}  # name -> the values of its BUFFERS_PLANNED, once exported


class ImageLogits(torch.nn.Module):
    """A Hugging Face vision model's logits from its pixels."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(pixel_values=x, return_dict=False)[0]


def export_vision(name, work):
    import transformers
    model_class, config_class, kwargs = HF_VISION[name]
    torch.manual_seed(0)
    model = ImageLogits(getattr(transformers, model_class)(getattr(transformers, config_class)(**kwargs)))
    target = torch.tensor([3])
    path, (params, frozen), saved = record(name, model, [torch.randn(1, 3, 64, 64)], ["input"],
                                           {"input": {0: "batch"}, "output": {0: "batch"}},
                                           lambda y: F.cross_entropy(y, target), work)
    return path, (params - unread_parameters(name, model), frozen), saved


def export_user(name, work):
    build, make_input, _ = USER_MODELS[name]
    torch.manual_seed(0)
    model = build()
    x = make_input()
    axes = {"input": {0: "batch"}, "output": {0: "batch"}}
    if x.dtype == torch.int64:
        axes["input"][1] = "sequence"
    target = torch.tensor([3])
    def loss(y):  # a class per sample, or a tag per token
        return F.cross_entropy(y, target) if y.dim() == 2 else F.cross_entropy(y.reshape(-1, y.shape[-1]), x.reshape(-1))
    return record(name, model, [x], ["input"], axes, loss, work)


def plan(dlplan, path, fusion, tokens):
    p = subprocess.run([dlplan, "plan", "--model", path, "--gpus", "1", "--gpu", "h100-80g", "--precision", "fp32",
                        "--strategy", "ddp", "--micro-batch", "1", "--fusion", fusion, "--format", "json"] +
                       (["--seq-len", "64"] if tokens else []), capture_output=True, text=True)
    if p.returncode != 0:
        return None, p.stderr.strip()
    j = json.loads(p.stdout)
    opaque = any("opaque" in note for note in j["model"]["notes"])
    return (j["model"]["params"], j["strategies"][0]["memory_max"]["activations"], opaque), None


MODELS_BY_NAME = {name for name, _, _ in MODELS}


def train_step(dlplan, path, tokens, work):
    """One step of `dlplan train` on the CPU engine from the file's plan
    (fp32, micro-batch 2, --fusion eager): None when it ran, its loss was
    finite and its peak was the plan's, else what went wrong."""
    dlplan, path = os.path.abspath(dlplan), os.path.abspath(path)
    plan_path = path + ".cpu-plan.json"
    p = subprocess.run([dlplan, "plan", "--model", path, "--gpus", "1", "--gpu", "cpu", "--precision", "fp32",
                        "--strategy", "ddp", "--micro-batch", "2", "--fusion", "eager", "--out", plan_path] +
                       (["--seq-len", "64"] if tokens else []), capture_output=True, text=True)
    if p.returncode != 0:
        return "plan for the CPU: " + p.stderr.strip()[-300:]
    t = subprocess.run([dlplan, "train", "--plan", plan_path, "--steps", "1"], capture_output=True, text=True,
                       cwd=work)
    if t.returncode != 0:
        return "train: " + (t.stderr.strip() or t.stdout.strip())[-300:]
    loss = [line.split("loss", 1)[1].split()[0] for line in t.stdout.splitlines() if line.startswith("step ")]
    if not loss or not math.isfinite(float(loss[0])):
        return f"train: no finite loss in {t.stdout[-300:]}"
    peak = [line.split() for line in t.stdout.splitlines() if line.strip().startswith("peak ")]
    if not peak or peak[0][-1] != "+0.0%":
        return f"train: measured peak is not the plan's: {peak}"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dlplan", required=True)
    ap.add_argument("--work", help="where the exports go (default: a temporary directory)")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="dlplan-beyond-")
    os.makedirs(work, exist_ok=True)
    print(f"PyTorch {torch.__version__}, torchvision {torchvision.__version__}; exports in {work}")
    print(f"{'model':20s} {'parameters':>12s} {'PyTorch saves':>14s} {'eager':>8s} {'engine':>8s}")
    failures = []
    try:
        import transformers
        print(f"transformers {transformers.__version__}")
        hf = [(name, None, None) for name in list(HF_MODELS) + list(SEQ2SEQ_MODELS) + list(HF_VISION)]
    except ImportError as e:
        print(f"SKIP the Hugging Face families: transformers is not importable ({e}); PYTHONPATH=<build>/pydeps")
        hf = []
    user = [(name, None, None) for name in USER_MODELS]
    for name, kwargs, side in MODELS + hf + user:
        if args.names and name not in args.names:
            continue
        tokens = name in HF_MODELS or name in SEQ2SEQ_MODELS or (name in USER_MODELS and USER_MODELS[name][2])
        if name in USER_MODELS:
            path, counts, torch_saved = export_user(name, work)
        elif name in SEQ2SEQ_MODELS:
            path, counts, torch_saved = export_seq2seq(name, work)
        elif name in HF_VISION:
            path, counts, torch_saved = export_vision(name, work)
        else:
            path, counts, torch_saved = export_hf(name, work) if name in HF_MODELS else export(name, kwargs, side, work)
        eager, error = plan(args.dlplan, path, "eager", tokens)
        if error:
            expected = REFUSED.get(name)
            said = error.split(f"{path}: ", 1)[-1]
            ok = expected is not None and said.startswith(expected)
            print(f"{name:20s} refused{'' if ok else ' (NOT EXPECTED)'}: {said[:160]}")
            if not ok:
                failures.append(f"{name}: {said[:300]}")
            continue
        if name in REFUSED:
            failures.append(f"{name} imports now: take it out of REFUSED")
        engine, _ = plan(args.dlplan, path, "engine", tokens)
        torch_saved += CUSTOM_FUNCTIONS.get(name, 0) + PERMUTED_VIEWS.get(name, 0) - MERGED_BY_EXPORTER.get(name, 0)
        err = eager[1] / torch_saved - 1
        line = (f"{name:20s} {eager[0]:>12,d} {torch_saved:>14,d} {100 * err:>+7.1f}% "
                f"{100 * (engine[1] / torch_saved - 1):>+7.1f}%")
        params, frozen = counts
        if name in FIXED_TABLES and not frozen:
            failures.append(f"{name}: no frozen parameter any more; take it out of FIXED_TABLES")
        if eager[0] != params - PARAMS_LEFT_OUT.get(name, 0) - (frozen if name in FIXED_TABLES else 0):
            failures.append(f"{name}: {eager[0]} parameters planned, PyTorch has {params} ({frozen} frozen)")
            line += f"  PARAMETERS: PyTorch has {params:,d}"
        elif name in FIXED_TABLES:
            line += (f"  (PyTorch {params - buffers_planned.get(name, 0):,d}: its frozen table of {frozen:,d} read "
                     f"as constants)")
        if buffers_planned.get(name):
            line += f"  (with a buffer of {buffers_planned[name]:,d} planned as a bias: final_logits_bias)"
        low, high = OPAQUE_BAND.get(name, (-0.05, 0.05))
        if eager[2] != (name in OPAQUE_BAND):
            failures.append(f"{name}: {'plans' if eager[2] else 'no longer plans'} opaque ops; update OPAQUE_BAND")
        if not low <= err <= high:
            failures.append(f"{name}: activations {100 * err:+.1f} % of PyTorch's saved bytes")
            line += f"  OUTSIDE [{100 * low:+.0f} %, {100 * high:+.0f} %]"
        elif eager[2]:
            line += "  (opaque ops: not trainable)"
        elif name not in MODELS_BY_NAME:  # the torchvision models are trained by the fixtures' tests
            trained = train_step(args.dlplan, path, tokens, work)
            if trained:
                failures.append(f"{name}: {trained}")
                line += "  TRAINING FAILED"
            else:
                line += "  (trains)"
        print(line, flush=True)
    for f in failures:
        print("FAIL:", f)
    print("all hold" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
