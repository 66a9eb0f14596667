import client from 'prom-client';
import type { SchedulerSnapshot } from '@stageml/router';

/** Prometheus metrics with vLLM-compatible names, so gateways that route by adapter work unchanged. */
export class ServerMetrics {
  /** The registry `/metrics` renders. */
  readonly registry = new client.Registry();
  readonly promptTokens: client.Counter<'model_name'>;
  readonly generationTokens: client.Counter<'model_name'>;
  readonly success: client.Counter<'model_name' | 'finished_reason'>;
  readonly paths: client.Counter<'path'>;
  /** Prompt tokens looked up in the prefix cache (vLLM's `vllm:prefix_cache_queries`). */
  readonly prefixCacheQueries: client.Counter<'model_name'>;
  /** Of those, tokens whose KV the cache served (vLLM's `vllm:prefix_cache_hits`). */
  readonly prefixCacheHits: client.Counter<'model_name'>;
  readonly latency: client.Histogram<'model_name'>;
  readonly ttft: client.Histogram<'model_name'>;
  /** `vllm:inter_token_latency_seconds`: time between consecutive tokens of a request. */
  readonly interTokenLatency: client.Histogram<'model_name'>;
  /** `vllm:request_queue_time_seconds`: time a request waited before running. */
  readonly queueTime: client.Histogram<'model_name'>;
  #kvCacheUsage: () => number = () => 0;

  /**
   * Metrics for `modelName`, reading scheduler counts at scrape time. `maxLora` is the adapter
   * capacity (`--max-loras`) that `vllm:lora_requests_info` reports as `max_lora`.
   */
  constructor(modelName: string, snapshot: () => SchedulerSnapshot, maxLora: () => number) {
    const registers = [this.registry];
    const kvUsage = (): number => this.#kvCacheUsage();
    client.collectDefaultMetrics({ register: this.registry, prefix: 'stageml_' });
    new client.Gauge({
      name: 'vllm:num_requests_running',
      help: 'Number of requests currently running.',
      labelNames: ['model_name'],
      registers,
      collect() {
        this.set({ model_name: modelName }, snapshot().running);
      },
    });
    new client.Gauge({
      name: 'vllm:num_requests_waiting',
      help: 'Number of requests waiting to be processed.',
      labelNames: ['model_name'],
      registers,
      collect() {
        this.set({ model_name: modelName }, snapshot().waiting);
      },
    });
    new client.Gauge({
      name: 'vllm:kv_cache_usage_perc',
      help: 'KV-cache usage. 1 means 100 percent usage.',
      labelNames: ['model_name'],
      registers,
      collect() {
        this.set({ model_name: modelName }, kvUsage());
      },
    });
    new client.Gauge({
      name: 'vllm:lora_requests_info',
      help: 'Running stats on LoRA requests: running and waiting adapters.',
      labelNames: ['running_lora_adapters', 'waiting_lora_adapters', 'max_lora'],
      registers,
      collect() {
        const s = snapshot();
        this.reset();
        this.set(
          {
            running_lora_adapters: Object.keys(s.runningByAdapter).filter((a) => a !== '').sort().join(','),
            waiting_lora_adapters: Object.keys(s.waitingByAdapter).filter((a) => a !== '').sort().join(','),
            max_lora: String(maxLora()),
          },
          Date.now() / 1000,
        );
      },
    });
    this.promptTokens = new client.Counter({ name: 'vllm:prompt_tokens_total', help: 'Number of prefill tokens processed.', labelNames: ['model_name'], registers });
    this.generationTokens = new client.Counter({ name: 'vllm:generation_tokens_total', help: 'Number of generation tokens processed.', labelNames: ['model_name'], registers });
    this.success = new client.Counter({ name: 'vllm:request_success_total', help: 'Count of successfully processed requests.', labelNames: ['model_name', 'finished_reason'], registers });
    this.prefixCacheQueries = new client.Counter({ name: 'vllm:prefix_cache_queries', help: 'Prefix cache queries, in terms of number of queried tokens.', labelNames: ['model_name'], registers });
    this.prefixCacheHits = new client.Counter({ name: 'vllm:prefix_cache_hits', help: 'Prefix cache hits, in terms of number of cached tokens.', labelNames: ['model_name'], registers });
    this.paths = new client.Counter({ name: 'stageml_requests_path_total', help: 'Requests by execution path (staged plan or fallback).', labelNames: ['path'], registers });
    const buckets = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];
    this.latency = new client.Histogram({ name: 'vllm:e2e_request_latency_seconds', help: 'End-to-end request latency in seconds.', labelNames: ['model_name'], buckets, registers });
    this.ttft = new client.Histogram({ name: 'vllm:time_to_first_token_seconds', help: 'Time to first token in seconds.', labelNames: ['model_name'], buckets, registers });
    const itl = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5];
    this.interTokenLatency = new client.Histogram({ name: 'vllm:inter_token_latency_seconds', help: 'Histogram of inter-token latency in seconds.', labelNames: ['model_name'], buckets: itl, registers });
    this.queueTime = new client.Histogram({ name: 'vllm:request_queue_time_seconds', help: 'Histogram of time spent in WAITING phase for request.', labelNames: ['model_name'], buckets, registers });
  }

  /** Feeds `vllm:kv_cache_usage_perc` (a fraction in [0, 1]) from the engine; 0 until set. */
  setKvCacheUsage(read: () => number): void {
    this.#kvCacheUsage = read;
  }
}

// Scale-out (docs/scale-out.md): on-demand adapter loads, which a gateway's adapter affinity keeps low.

/**
 * Registers `stageml_adapter_loads_total` and `stageml_adapter_evictions_total` (read at scrape
 * time from the resolver) and `stageml_adapters_loaded_on_demand` on `registry`.
 */
export function registerResolverMetrics(registry: client.Registry, resolver: { readonly loads: number; readonly evictions: number; readonly onDemand: readonly string[] }): void {
  const registers = [registry];
  new client.Counter({
    name: 'stageml_adapter_loads_total',
    help: 'Adapters loaded on demand from the adapter roots.',
    registers,
    collect() {
      this.reset();
      this.inc(resolver.loads);
    },
  });
  new client.Counter({
    name: 'stageml_adapter_evictions_total',
    help: 'Adapters unloaded to make room for an on-demand load (least recently used first).',
    registers,
    collect() {
      this.reset();
      this.inc(resolver.evictions);
    },
  });
  new client.Gauge({
    name: 'stageml_adapters_loaded_on_demand',
    help: 'Adapters currently loaded on demand.',
    registers,
    collect() {
      this.set(resolver.onDemand.length);
    },
  });
}
