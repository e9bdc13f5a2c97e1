// A fetch that serves a tiny Qwen3 checkpoint the way the app's bundled demo is served
// (DEMO_URL + manifest.json + its files), for engine tests without a browser or a server.
import { makeTinyCheckpoint, type TinyCheckpointOptions } from '../../src/model/tinyModel.ts';
import { qwen3TokenizerFiles } from '../../src/model/tinyModel.node.ts';

export const DEMO_URL = 'http://demo.invalid/tiny-demo/';

export async function tinyDemoFetch(
  shape: Omit<TinyCheckpointOptions, 'tokenizerJson' | 'tokenizerConfig'>,
): Promise<typeof fetch> {
  const { files } = makeTinyCheckpoint({ ...(await qwen3TokenizerFiles()), tied: true, ...shape });
  const manifest = JSON.stringify({ name: 'tiny-test', files: [...files.keys()] });
  return (async (input: RequestInfo | URL) => {
    const name = String(input).slice(DEMO_URL.length);
    const body = name === 'manifest.json' ? manifest : files.get(name);
    return body === undefined ? new Response('missing', { status: 404 }) : new Response(body as BodyInit);
  }) as typeof fetch;
}
