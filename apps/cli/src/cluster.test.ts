import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { checkHaproxy, renderHaproxyConfig } from './commands/cluster.js';
import { ExitCode } from './index.js';
import { runCaptured as run } from './test-fixtures.js';

const template = readFileSync(fileURLToPath(new URL('../../../deploy/haproxy/haproxy.cfg.tmpl', import.meta.url)), 'utf8');
const haveHaproxy = spawnSync('haproxy', ['-v']).status === 0;

describe('HAProxy config', () => {
  const cfg = renderHaproxyConfig(template, { bind: '127.0.0.1:9000', servers: [['replica-1', '127.0.0.1:9001'], ['replica-2', '127.0.0.1:9002']], hashBalanceFactor: 150 });

  it('hashes on the body model with consistent hashing, health checks and retries', () => {
    expect(cfg).toContain('bind 127.0.0.1:9000');
    expect(cfg).toContain('option http-buffer-request');
    expect(cfg).toContain("balance hash req.body,json_query('$.model')");
    expect(cfg).toContain('hash-type consistent');
    expect(cfg).toContain('hash-balance-factor 150');
    expect(cfg).toContain('option httpchk GET /ready');
    expect(cfg).toMatch(/retry-on conn-failure .*503/);
    expect(cfg).toContain('option redispatch');
    expect(cfg).toContain('    server replica-2 127.0.0.1:9002');
    expect(cfg).not.toMatch(/\{\{/);
  });

  it('rejects a template field it does not know', () => {
    expect(() => renderHaproxyConfig('bind {{nope}}', { bind: 'x', servers: [], hashBalanceFactor: 0 })).toThrow(expect.objectContaining({ code: 'CLI_USAGE', message: expect.stringContaining('{{nope}}') as unknown }));
  });

  it.runIf(haveHaproxy || process.env['CI'] !== undefined)('is accepted by the installed HAProxy', () => {
    const dir = mkdtempSync(join(tmpdir(), 'stageml-haproxy-'));
    writeFileSync(join(dir, 'haproxy.cfg'), cfg);
    const r = spawnSync('haproxy', ['-c', '-f', join(dir, 'haproxy.cfg')], { encoding: 'utf8' });
    expect(r.stderr + r.stdout).toContain('Configuration file is valid');
    expect(r.status).toBe(0);
  });
});

describe('stageml cluster', () => {
  it('reports a missing haproxy with CLI_HAPROXY_MISSING and the apt hint', async () => {
    expect(() => checkHaproxy('/nonexistent/haproxy')).toThrow(expect.objectContaining({ code: 'CLI_HAPROXY_MISSING' }));
    const r = await run(['cluster', '--replicas', '2', '--port', '9000', '--haproxy', '/nonexistent/haproxy', '--model', 'x']);
    expect(r.code).toBe(ExitCode.UNAVAILABLE);
    expect(r.err).toContain('error[CLI_HAPROXY_MISSING]');
    expect(r.err).toContain('apt-get install -y haproxy');
  });

  it('refuses serve flags it sets for each replica itself', async () => {
    const r = await run(['cluster', '--replicas', '2', '--port', '9000', '--model', 'x', '--replica-name', 'a']);
    expect(r.code).toBe(ExitCode.USAGE);
    expect(r.err).toContain('--replica-name is set by stageml cluster');
  });

  it('rejects a bounded-load factor of 100 or less (other than 0)', async () => {
    const r = await run(['cluster', '--replicas', '2', '--port', '9000', '--hash-balance-factor', '90']);
    expect(r.code).toBe(ExitCode.USAGE);
    expect(r.err).toContain('--hash-balance-factor must be 0 or above 100');
  });
});
