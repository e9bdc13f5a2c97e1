// Entry: the engine worker, the store around it, the app.
import { StrictMode } from 'react';
import { createRoot } from 'react-dom/client';
import { loadGovReportBrowser } from '../game/govreport.browser.ts';
import { StoreContext } from '../store/hooks.ts';
import { createAppStore } from '../store/store.ts';
import { App } from '../ui/App.tsx';
import { callback, startEngineWorker } from '../worker/client.ts';
import '../ui/app.css';

function saveFile(name: string, blob: Blob) {
  const url = URL.createObjectURL(blob);
  const a = document.createElement('a');
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

const hasWebGpu = typeof navigator !== 'undefined' && 'gpu' in navigator && !!navigator.gpu;
const { api } = startEngineWorker();
const store = createAppStore({
  engine: api,
  callback,
  hasWebGpu,
  loadBundledDocuments: loadGovReportBrowser,
  saveFile,
});

createRoot(document.getElementById('root')!).render(
  <StrictMode>
    <StoreContext.Provider value={store}>
      <App />
    </StoreContext.Provider>
  </StrictMode>,
);
