/** A checkpoint file (config, tokenizer, safetensors) that cannot be used, naming the file and tensor. */
export class ModelLoadError extends Error {
  readonly file: string;
  readonly tensor?: string;

  constructor(file: string, message: string, tensor?: string) {
    super(tensor === undefined ? `${file}: ${message}` : `${file}: tensor "${tensor}": ${message}`);
    this.name = 'ModelLoadError';
    this.file = file;
    if (tensor !== undefined) this.tensor = tensor;
  }
}
