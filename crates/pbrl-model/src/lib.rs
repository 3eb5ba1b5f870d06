//! The model runtime: a trainable transformer on candle, its loading and saving, tokenizer and
//! chat template, batched sampling and log-prob scoring (the `pbrl-model` crate). It knows
//! nothing of preferences, configs or run directories: the compiler keeps it so, since it
//! depends on nothing of the trainer.
pub mod batch;
pub mod chat_template;
pub mod checkpoint;
pub mod config;
pub mod dropout;
pub mod gemm;
pub mod heads;
pub mod kv_cache;
pub mod linear;
pub mod load;
pub mod lora;
pub mod lora_adapter;
pub mod mode;
pub mod ops;
pub mod permissions;
pub mod pool;
pub mod readers;
pub mod required;
pub mod rope;
pub mod sampling;
pub mod scoring;
pub mod seed;
pub mod source;
pub mod tiny;
pub mod tokenizer;
pub mod transformer;
pub mod weight_grads;

pub use chat_template::ChatTemplate;
pub use config::{Architecture, ModelConfig};
pub use kv_cache::KvCache;
pub use load::LoadedModel;
pub use mode::Mode;
pub use rope::{Rope, RopeScaling};
pub use sampling::{SampleRequest, SamplingParams};
pub use scoring::{LastToken, ScoreRow};
pub use source::{ModelSource, SourceFiles};
pub use tokenizer::{ChatTokenizer, SpecialTokens};
pub use transformer::{Backbone, CausalLm};
