// React access to the store: a context holding the store and narrow selectors.
import { createContext, useContext } from 'react';
import { useStore } from 'zustand';
import { useShallow } from 'zustand/react/shallow';
import type { AppState, AppStore } from './store.ts';

export const StoreContext = createContext<AppStore | null>(null);

function useAppStore(): AppStore {
  const store = useContext(StoreContext);
  if (!store) throw new Error('StoreContext is missing');
  return store;
}

export function useApp<T>(selector: (s: AppState) => T): T {
  return useStore(useAppStore(), selector);
}

/** For selectors that build a new array or object each time. */
export function useAppShallow<T>(selector: (s: AppState) => T): T {
  return useStore(useAppStore(), useShallow(selector));
}

export function useAppGet(): () => AppState {
  return useAppStore().getState;
}
