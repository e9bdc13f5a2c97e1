// File names that come from outside (a shard index, the Hub's file listing, a manifest) are
// relative paths below one model root. Anything that could step out of that root, or be read as
// a URL or an absolute path by some platform, is refused before it reaches a folder, a URL or a
// cache key.

/** Why `file` is not a safe relative path below a model root, or null when it is. */
export function unsafePathReason(file: string): string | null {
  if (file.length === 0) return 'the name is empty';
  if (file.length > 1024) return `the name is ${file.length} characters long (at most 1024)`;
  // eslint-disable-next-line no-control-regex -- control characters are what this refuses
  if (/[\u0000-\u001f\u007f]/.test(file)) return 'the name holds a control character';
  if (file.includes('\\')) return 'the name holds a backslash (only "/" separates folders)';
  if (file.startsWith('/')) return 'the name is an absolute path (leading "/")';
  // A drive letter ("C:") or a URL scheme ("https:", "file:", "data:") before any folder.
  if (/^[A-Za-z][A-Za-z0-9+.-]*:/.test(file)) return 'the name starts like a URL or a drive letter ("scheme:")';
  for (const seg of file.split('/')) {
    if (seg === '') return 'the name has an empty folder ("//" or a trailing "/")';
    if (seg === '.' || seg === '..') return `the name has a "${seg}" segment`;
  }
  return null;
}

/** Throws `make(reason)` when `file` is not a safe relative path. */
export function checkRelativePath(file: string, make: (reason: string) => Error): string {
  const why = unsafePathReason(file);
  if (why) throw make(why);
  return file;
}

/** A relative path as a URL path: each segment percent-encoded, the '/' between them kept. */
export function encodePathSegments(file: string): string {
  return file.split('/').map(encodeURIComponent).join('/');
}
