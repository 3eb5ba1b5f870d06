//! The model runtime: a trainable transformer on candle, its loading and saving, tokenizer and
//! chat template, batched sampling and log-prob scoring. It knows nothing of preferences.
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
pub mod ops;
pub mod pool;
pub mod readers;
pub mod rope;
pub mod sampling;
pub mod scoring;
pub mod tiny;
pub mod tokenizer;
pub mod transformer;
pub mod weight_grads;

pub use chat_template::ChatTemplate;
pub use config::{Architecture, ModelConfig};
pub use kv_cache::KvCache;
pub use load::{LoadedModel, ModelSource};
pub use rope::{Rope, RopeScaling};
pub use sampling::{SampleRequest, SamplingParams};
pub use scoring::{LastToken, ScoreRow};
pub use tokenizer::{ChatTokenizer, SpecialTokens};
pub use transformer::{Backbone, CausalLm, Mode};
