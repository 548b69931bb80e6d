// agui-hub.js: generated from js/src by `npm run build` (agui-hub); do not edit.

// node_modules/@msgpack/msgpack/dist.esm/utils/utf8.mjs
function utf8Count(str) {
  const strLength = str.length;
  let byteLength = 0;
  let pos = 0;
  while (pos < strLength) {
    let value = str.charCodeAt(pos++);
    if ((value & 4294967168) === 0) {
      byteLength++;
      continue;
    } else if ((value & 4294965248) === 0) {
      byteLength += 2;
    } else {
      if (value >= 55296 && value <= 56319) {
        if (pos < strLength) {
          const extra = str.charCodeAt(pos);
          if ((extra & 64512) === 56320) {
            ++pos;
            value = ((value & 1023) << 10) + (extra & 1023) + 65536;
          }
        }
      }
      if ((value & 4294901760) === 0) {
        byteLength += 3;
      } else {
        byteLength += 4;
      }
    }
  }
  return byteLength;
}
function utf8EncodeJs(str, output, outputOffset) {
  const strLength = str.length;
  let offset = outputOffset;
  let pos = 0;
  while (pos < strLength) {
    let value = str.charCodeAt(pos++);
    if ((value & 4294967168) === 0) {
      output[offset++] = value;
      continue;
    } else if ((value & 4294965248) === 0) {
      output[offset++] = value >> 6 & 31 | 192;
    } else {
      if (value >= 55296 && value <= 56319) {
        if (pos < strLength) {
          const extra = str.charCodeAt(pos);
          if ((extra & 64512) === 56320) {
            ++pos;
            value = ((value & 1023) << 10) + (extra & 1023) + 65536;
          }
        }
      }
      if ((value & 4294901760) === 0) {
        output[offset++] = value >> 12 & 15 | 224;
        output[offset++] = value >> 6 & 63 | 128;
      } else {
        output[offset++] = value >> 18 & 7 | 240;
        output[offset++] = value >> 12 & 63 | 128;
        output[offset++] = value >> 6 & 63 | 128;
      }
    }
    output[offset++] = value & 63 | 128;
  }
}
var sharedTextEncoder = new TextEncoder();
var TEXT_ENCODER_THRESHOLD = 50;
function utf8EncodeTE(str, output, outputOffset) {
  sharedTextEncoder.encodeInto(str, output.subarray(outputOffset));
}
function utf8Encode(str, output, outputOffset) {
  if (str.length > TEXT_ENCODER_THRESHOLD) {
    utf8EncodeTE(str, output, outputOffset);
  } else {
    utf8EncodeJs(str, output, outputOffset);
  }
}
var CHUNK_SIZE = 4096;
function utf8DecodeJs(bytes, inputOffset, byteLength) {
  let offset = inputOffset;
  const end = offset + byteLength;
  const units = [];
  let result = "";
  while (offset < end) {
    const byte1 = bytes[offset++];
    if ((byte1 & 128) === 0) {
      units.push(byte1);
    } else if ((byte1 & 224) === 192) {
      const byte2 = bytes[offset++] & 63;
      units.push((byte1 & 31) << 6 | byte2);
    } else if ((byte1 & 240) === 224) {
      const byte2 = bytes[offset++] & 63;
      const byte3 = bytes[offset++] & 63;
      units.push((byte1 & 31) << 12 | byte2 << 6 | byte3);
    } else if ((byte1 & 248) === 240) {
      const byte2 = bytes[offset++] & 63;
      const byte3 = bytes[offset++] & 63;
      const byte4 = bytes[offset++] & 63;
      let unit = (byte1 & 7) << 18 | byte2 << 12 | byte3 << 6 | byte4;
      if (unit > 65535) {
        unit -= 65536;
        units.push(unit >>> 10 & 1023 | 55296);
        unit = 56320 | unit & 1023;
      }
      units.push(unit);
    } else {
      units.push(byte1);
    }
    if (units.length >= CHUNK_SIZE) {
      result += String.fromCharCode(...units);
      units.length = 0;
    }
  }
  if (units.length > 0) {
    result += String.fromCharCode(...units);
  }
  return result;
}
var sharedTextDecoder = new TextDecoder();
var TEXT_DECODER_THRESHOLD = 200;
function utf8DecodeTD(bytes, inputOffset, byteLength) {
  const stringBytes = bytes.subarray(inputOffset, inputOffset + byteLength);
  return sharedTextDecoder.decode(stringBytes);
}
function utf8Decode(bytes, inputOffset, byteLength) {
  if (byteLength > TEXT_DECODER_THRESHOLD) {
    return utf8DecodeTD(bytes, inputOffset, byteLength);
  } else {
    return utf8DecodeJs(bytes, inputOffset, byteLength);
  }
}

// node_modules/@msgpack/msgpack/dist.esm/ExtData.mjs
var ExtData = class {
  type;
  data;
  constructor(type, data) {
    this.type = type;
    this.data = data;
  }
};

// node_modules/@msgpack/msgpack/dist.esm/DecodeError.mjs
var DecodeError = class _DecodeError extends Error {
  constructor(message) {
    super(message);
    const proto = Object.create(_DecodeError.prototype);
    Object.setPrototypeOf(this, proto);
    Object.defineProperty(this, "name", {
      configurable: true,
      enumerable: false,
      value: _DecodeError.name
    });
  }
};

// node_modules/@msgpack/msgpack/dist.esm/utils/int.mjs
var UINT32_MAX = 4294967295;
function setUint64(view, offset, value) {
  const high = value / 4294967296;
  const low = value;
  view.setUint32(offset, high);
  view.setUint32(offset + 4, low);
}
function setInt64(view, offset, value) {
  const high = Math.floor(value / 4294967296);
  const low = value;
  view.setUint32(offset, high);
  view.setUint32(offset + 4, low);
}
function getInt64(view, offset) {
  const high = view.getInt32(offset);
  const low = view.getUint32(offset + 4);
  return high * 4294967296 + low;
}
function getUint64(view, offset) {
  const high = view.getUint32(offset);
  const low = view.getUint32(offset + 4);
  return high * 4294967296 + low;
}

// node_modules/@msgpack/msgpack/dist.esm/timestamp.mjs
var EXT_TIMESTAMP = -1;
var TIMESTAMP32_MAX_SEC = 4294967296 - 1;
var TIMESTAMP64_MAX_SEC = 17179869184 - 1;
function encodeTimeSpecToTimestamp({ sec, nsec }) {
  if (sec >= 0 && nsec >= 0 && sec <= TIMESTAMP64_MAX_SEC) {
    if (nsec === 0 && sec <= TIMESTAMP32_MAX_SEC) {
      const rv = new Uint8Array(4);
      const view = new DataView(rv.buffer);
      view.setUint32(0, sec);
      return rv;
    } else {
      const secHigh = sec / 4294967296;
      const secLow = sec & 4294967295;
      const rv = new Uint8Array(8);
      const view = new DataView(rv.buffer);
      view.setUint32(0, nsec << 2 | secHigh & 3);
      view.setUint32(4, secLow);
      return rv;
    }
  } else {
    const rv = new Uint8Array(12);
    const view = new DataView(rv.buffer);
    view.setUint32(0, nsec);
    setInt64(view, 4, sec);
    return rv;
  }
}
function encodeDateToTimeSpec(date) {
  const msec = date.getTime();
  const sec = Math.floor(msec / 1e3);
  const nsec = (msec - sec * 1e3) * 1e6;
  const nsecInSec = Math.floor(nsec / 1e9);
  return {
    sec: sec + nsecInSec,
    nsec: nsec - nsecInSec * 1e9
  };
}
function encodeTimestampExtension(object) {
  if (object instanceof Date) {
    const timeSpec = encodeDateToTimeSpec(object);
    return encodeTimeSpecToTimestamp(timeSpec);
  } else {
    return null;
  }
}
function decodeTimestampToTimeSpec(data) {
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  switch (data.byteLength) {
    case 4: {
      const sec = view.getUint32(0);
      const nsec = 0;
      return { sec, nsec };
    }
    case 8: {
      const nsec30AndSecHigh2 = view.getUint32(0);
      const secLow32 = view.getUint32(4);
      const sec = (nsec30AndSecHigh2 & 3) * 4294967296 + secLow32;
      const nsec = nsec30AndSecHigh2 >>> 2;
      return { sec, nsec };
    }
    case 12: {
      const sec = getInt64(view, 4);
      const nsec = view.getUint32(0);
      return { sec, nsec };
    }
    default:
      throw new DecodeError(`Unrecognized data size for timestamp (expected 4, 8, or 12): ${data.length}`);
  }
}
function decodeTimestampExtension(data) {
  const timeSpec = decodeTimestampToTimeSpec(data);
  return new Date(timeSpec.sec * 1e3 + timeSpec.nsec / 1e6);
}
var timestampExtension = {
  type: EXT_TIMESTAMP,
  encode: encodeTimestampExtension,
  decode: decodeTimestampExtension
};

// node_modules/@msgpack/msgpack/dist.esm/ExtensionCodec.mjs
var ExtensionCodec = class _ExtensionCodec {
  static defaultCodec = new _ExtensionCodec();
  // ensures ExtensionCodecType<X> matches ExtensionCodec<X>
  // this will make type errors a lot more clear
  // eslint-disable-next-line @typescript-eslint/naming-convention
  __brand;
  // built-in extensions
  builtInEncoders = [];
  builtInDecoders = [];
  // custom extensions
  encoders = [];
  decoders = [];
  constructor() {
    this.register(timestampExtension);
  }
  register({ type, encode, decode }) {
    if (type >= 0) {
      this.encoders[type] = encode;
      this.decoders[type] = decode;
    } else {
      const index = -1 - type;
      this.builtInEncoders[index] = encode;
      this.builtInDecoders[index] = decode;
    }
  }
  tryToEncode(object, context) {
    for (let i = 0; i < this.builtInEncoders.length; i++) {
      const encodeExt = this.builtInEncoders[i];
      if (encodeExt != null) {
        const data = encodeExt(object, context);
        if (data != null) {
          const type = -1 - i;
          return new ExtData(type, data);
        }
      }
    }
    for (let i = 0; i < this.encoders.length; i++) {
      const encodeExt = this.encoders[i];
      if (encodeExt != null) {
        const data = encodeExt(object, context);
        if (data != null) {
          const type = i;
          return new ExtData(type, data);
        }
      }
    }
    if (object instanceof ExtData) {
      return object;
    }
    return null;
  }
  decode(data, type, context) {
    const decodeExt = type < 0 ? this.builtInDecoders[-1 - type] : this.decoders[type];
    if (decodeExt) {
      return decodeExt(data, type, context);
    } else {
      return new ExtData(type, data);
    }
  }
};

// node_modules/@msgpack/msgpack/dist.esm/utils/typedArrays.mjs
function isArrayBufferLike(buffer) {
  return buffer instanceof ArrayBuffer || typeof SharedArrayBuffer !== "undefined" && buffer instanceof SharedArrayBuffer;
}
function ensureUint8Array(buffer) {
  if (buffer instanceof Uint8Array) {
    return buffer;
  } else if (ArrayBuffer.isView(buffer)) {
    return new Uint8Array(buffer.buffer, buffer.byteOffset, buffer.byteLength);
  } else if (isArrayBufferLike(buffer)) {
    return new Uint8Array(buffer);
  } else {
    return Uint8Array.from(buffer);
  }
}

// node_modules/@msgpack/msgpack/dist.esm/Encoder.mjs
var DEFAULT_MAX_DEPTH = 100;
var DEFAULT_INITIAL_BUFFER_SIZE = 2048;
var Encoder = class _Encoder {
  extensionCodec;
  context;
  useBigInt64;
  maxDepth;
  initialBufferSize;
  sortKeys;
  forceFloat32;
  ignoreUndefined;
  forceIntegerToFloat;
  pos;
  view;
  bytes;
  entered = false;
  constructor(options) {
    this.extensionCodec = options?.extensionCodec ?? ExtensionCodec.defaultCodec;
    this.context = options?.context;
    this.useBigInt64 = options?.useBigInt64 ?? false;
    this.maxDepth = options?.maxDepth ?? DEFAULT_MAX_DEPTH;
    this.initialBufferSize = options?.initialBufferSize ?? DEFAULT_INITIAL_BUFFER_SIZE;
    this.sortKeys = options?.sortKeys ?? false;
    this.forceFloat32 = options?.forceFloat32 ?? false;
    this.ignoreUndefined = options?.ignoreUndefined ?? false;
    this.forceIntegerToFloat = options?.forceIntegerToFloat ?? false;
    this.pos = 0;
    this.view = new DataView(new ArrayBuffer(this.initialBufferSize));
    this.bytes = new Uint8Array(this.view.buffer);
  }
  clone() {
    return new _Encoder({
      extensionCodec: this.extensionCodec,
      context: this.context,
      useBigInt64: this.useBigInt64,
      maxDepth: this.maxDepth,
      initialBufferSize: this.initialBufferSize,
      sortKeys: this.sortKeys,
      forceFloat32: this.forceFloat32,
      ignoreUndefined: this.ignoreUndefined,
      forceIntegerToFloat: this.forceIntegerToFloat
    });
  }
  reinitializeState() {
    this.pos = 0;
  }
  /**
   * This is almost equivalent to {@link Encoder#encode}, but it returns an reference of the encoder's internal buffer and thus much faster than {@link Encoder#encode}.
   *
   * @returns Encodes the object and returns a shared reference the encoder's internal buffer.
   */
  encodeSharedRef(object) {
    if (this.entered) {
      const instance = this.clone();
      return instance.encodeSharedRef(object);
    }
    try {
      this.entered = true;
      this.reinitializeState();
      this.doEncode(object, 1);
      return this.bytes.subarray(0, this.pos);
    } finally {
      this.entered = false;
    }
  }
  /**
   * @returns Encodes the object and returns a copy of the encoder's internal buffer.
   */
  encode(object) {
    if (this.entered) {
      const instance = this.clone();
      return instance.encode(object);
    }
    try {
      this.entered = true;
      this.reinitializeState();
      this.doEncode(object, 1);
      return this.bytes.slice(0, this.pos);
    } finally {
      this.entered = false;
    }
  }
  doEncode(object, depth) {
    if (depth > this.maxDepth) {
      throw new Error(`Too deep objects in depth ${depth}`);
    }
    if (object == null) {
      this.encodeNil();
    } else if (typeof object === "boolean") {
      this.encodeBoolean(object);
    } else if (typeof object === "number") {
      if (!this.forceIntegerToFloat) {
        this.encodeNumber(object);
      } else {
        this.encodeNumberAsFloat(object);
      }
    } else if (typeof object === "string") {
      this.encodeString(object);
    } else if (this.useBigInt64 && typeof object === "bigint") {
      this.encodeBigInt64(object);
    } else {
      this.encodeObject(object, depth);
    }
  }
  ensureBufferSizeToWrite(sizeToWrite) {
    const requiredSize = this.pos + sizeToWrite;
    if (this.view.byteLength < requiredSize) {
      this.resizeBuffer(requiredSize * 2);
    }
  }
  resizeBuffer(newSize) {
    const newBuffer = new ArrayBuffer(newSize);
    const newBytes = new Uint8Array(newBuffer);
    const newView = new DataView(newBuffer);
    newBytes.set(this.bytes);
    this.view = newView;
    this.bytes = newBytes;
  }
  encodeNil() {
    this.writeU8(192);
  }
  encodeBoolean(object) {
    if (object === false) {
      this.writeU8(194);
    } else {
      this.writeU8(195);
    }
  }
  encodeNumber(object) {
    if (!this.forceIntegerToFloat && Number.isSafeInteger(object)) {
      if (object >= 0) {
        if (object < 128) {
          this.writeU8(object);
        } else if (object < 256) {
          this.writeU8(204);
          this.writeU8(object);
        } else if (object < 65536) {
          this.writeU8(205);
          this.writeU16(object);
        } else if (object < 4294967296) {
          this.writeU8(206);
          this.writeU32(object);
        } else if (!this.useBigInt64) {
          this.writeU8(207);
          this.writeU64(object);
        } else {
          this.encodeNumberAsFloat(object);
        }
      } else {
        if (object >= -32) {
          this.writeU8(224 | object + 32);
        } else if (object >= -128) {
          this.writeU8(208);
          this.writeI8(object);
        } else if (object >= -32768) {
          this.writeU8(209);
          this.writeI16(object);
        } else if (object >= -2147483648) {
          this.writeU8(210);
          this.writeI32(object);
        } else if (!this.useBigInt64) {
          this.writeU8(211);
          this.writeI64(object);
        } else {
          this.encodeNumberAsFloat(object);
        }
      }
    } else {
      this.encodeNumberAsFloat(object);
    }
  }
  encodeNumberAsFloat(object) {
    if (this.forceFloat32) {
      this.writeU8(202);
      this.writeF32(object);
    } else {
      this.writeU8(203);
      this.writeF64(object);
    }
  }
  encodeBigInt64(object) {
    if (object >= BigInt(0)) {
      this.writeU8(207);
      this.writeBigUint64(object);
    } else {
      this.writeU8(211);
      this.writeBigInt64(object);
    }
  }
  writeStringHeader(byteLength) {
    if (byteLength < 32) {
      this.writeU8(160 + byteLength);
    } else if (byteLength < 256) {
      this.writeU8(217);
      this.writeU8(byteLength);
    } else if (byteLength < 65536) {
      this.writeU8(218);
      this.writeU16(byteLength);
    } else if (byteLength < 4294967296) {
      this.writeU8(219);
      this.writeU32(byteLength);
    } else {
      throw new Error(`Too long string: ${byteLength} bytes in UTF-8`);
    }
  }
  encodeString(object) {
    const maxHeaderSize = 1 + 4;
    const byteLength = utf8Count(object);
    this.ensureBufferSizeToWrite(maxHeaderSize + byteLength);
    this.writeStringHeader(byteLength);
    utf8Encode(object, this.bytes, this.pos);
    this.pos += byteLength;
  }
  encodeObject(object, depth) {
    const ext = this.extensionCodec.tryToEncode(object, this.context);
    if (ext != null) {
      this.encodeExtension(ext);
    } else if (Array.isArray(object)) {
      this.encodeArray(object, depth);
    } else if (ArrayBuffer.isView(object)) {
      this.encodeBinary(object);
    } else if (typeof object === "object") {
      this.encodeMap(object, depth);
    } else {
      throw new Error(`Unrecognized object: ${Object.prototype.toString.apply(object)}`);
    }
  }
  encodeBinary(object) {
    const size = object.byteLength;
    if (size < 256) {
      this.writeU8(196);
      this.writeU8(size);
    } else if (size < 65536) {
      this.writeU8(197);
      this.writeU16(size);
    } else if (size < 4294967296) {
      this.writeU8(198);
      this.writeU32(size);
    } else {
      throw new Error(`Too large binary: ${size}`);
    }
    const bytes = ensureUint8Array(object);
    this.writeU8a(bytes);
  }
  encodeArray(object, depth) {
    const size = object.length;
    if (size < 16) {
      this.writeU8(144 + size);
    } else if (size < 65536) {
      this.writeU8(220);
      this.writeU16(size);
    } else if (size < 4294967296) {
      this.writeU8(221);
      this.writeU32(size);
    } else {
      throw new Error(`Too large array: ${size}`);
    }
    for (const item of object) {
      this.doEncode(item, depth + 1);
    }
  }
  countWithoutUndefined(object, keys) {
    let count = 0;
    for (const key of keys) {
      if (object[key] !== void 0) {
        count++;
      }
    }
    return count;
  }
  encodeMap(object, depth) {
    const keys = Object.keys(object);
    if (this.sortKeys) {
      keys.sort();
    }
    const size = this.ignoreUndefined ? this.countWithoutUndefined(object, keys) : keys.length;
    if (size < 16) {
      this.writeU8(128 + size);
    } else if (size < 65536) {
      this.writeU8(222);
      this.writeU16(size);
    } else if (size < 4294967296) {
      this.writeU8(223);
      this.writeU32(size);
    } else {
      throw new Error(`Too large map object: ${size}`);
    }
    for (const key of keys) {
      const value = object[key];
      if (!(this.ignoreUndefined && value === void 0)) {
        this.encodeString(key);
        this.doEncode(value, depth + 1);
      }
    }
  }
  encodeExtension(ext) {
    if (typeof ext.data === "function") {
      const data = ext.data(this.pos + 6);
      const size2 = data.length;
      if (size2 >= 4294967296) {
        throw new Error(`Too large extension object: ${size2}`);
      }
      this.writeU8(201);
      this.writeU32(size2);
      this.writeI8(ext.type);
      this.writeU8a(data);
      return;
    }
    const size = ext.data.length;
    if (size === 1) {
      this.writeU8(212);
    } else if (size === 2) {
      this.writeU8(213);
    } else if (size === 4) {
      this.writeU8(214);
    } else if (size === 8) {
      this.writeU8(215);
    } else if (size === 16) {
      this.writeU8(216);
    } else if (size < 256) {
      this.writeU8(199);
      this.writeU8(size);
    } else if (size < 65536) {
      this.writeU8(200);
      this.writeU16(size);
    } else if (size < 4294967296) {
      this.writeU8(201);
      this.writeU32(size);
    } else {
      throw new Error(`Too large extension object: ${size}`);
    }
    this.writeI8(ext.type);
    this.writeU8a(ext.data);
  }
  writeU8(value) {
    this.ensureBufferSizeToWrite(1);
    this.view.setUint8(this.pos, value);
    this.pos++;
  }
  writeU8a(values) {
    const size = values.length;
    this.ensureBufferSizeToWrite(size);
    this.bytes.set(values, this.pos);
    this.pos += size;
  }
  writeI8(value) {
    this.ensureBufferSizeToWrite(1);
    this.view.setInt8(this.pos, value);
    this.pos++;
  }
  writeU16(value) {
    this.ensureBufferSizeToWrite(2);
    this.view.setUint16(this.pos, value);
    this.pos += 2;
  }
  writeI16(value) {
    this.ensureBufferSizeToWrite(2);
    this.view.setInt16(this.pos, value);
    this.pos += 2;
  }
  writeU32(value) {
    this.ensureBufferSizeToWrite(4);
    this.view.setUint32(this.pos, value);
    this.pos += 4;
  }
  writeI32(value) {
    this.ensureBufferSizeToWrite(4);
    this.view.setInt32(this.pos, value);
    this.pos += 4;
  }
  writeF32(value) {
    this.ensureBufferSizeToWrite(4);
    this.view.setFloat32(this.pos, value);
    this.pos += 4;
  }
  writeF64(value) {
    this.ensureBufferSizeToWrite(8);
    this.view.setFloat64(this.pos, value);
    this.pos += 8;
  }
  writeU64(value) {
    this.ensureBufferSizeToWrite(8);
    setUint64(this.view, this.pos, value);
    this.pos += 8;
  }
  writeI64(value) {
    this.ensureBufferSizeToWrite(8);
    setInt64(this.view, this.pos, value);
    this.pos += 8;
  }
  writeBigUint64(value) {
    this.ensureBufferSizeToWrite(8);
    this.view.setBigUint64(this.pos, value);
    this.pos += 8;
  }
  writeBigInt64(value) {
    this.ensureBufferSizeToWrite(8);
    this.view.setBigInt64(this.pos, value);
    this.pos += 8;
  }
};

// node_modules/@msgpack/msgpack/dist.esm/utils/prettyByte.mjs
function prettyByte(byte) {
  return `${byte < 0 ? "-" : ""}0x${Math.abs(byte).toString(16).padStart(2, "0")}`;
}

// node_modules/@msgpack/msgpack/dist.esm/CachedKeyDecoder.mjs
var DEFAULT_MAX_KEY_LENGTH = 16;
var DEFAULT_MAX_LENGTH_PER_KEY = 16;
var CachedKeyDecoder = class {
  hit = 0;
  miss = 0;
  caches;
  maxKeyLength;
  maxLengthPerKey;
  constructor(maxKeyLength = DEFAULT_MAX_KEY_LENGTH, maxLengthPerKey = DEFAULT_MAX_LENGTH_PER_KEY) {
    this.maxKeyLength = maxKeyLength;
    this.maxLengthPerKey = maxLengthPerKey;
    this.caches = [];
    for (let i = 0; i < this.maxKeyLength; i++) {
      this.caches.push([]);
    }
  }
  canBeCached(byteLength) {
    return byteLength > 0 && byteLength <= this.maxKeyLength;
  }
  find(bytes, inputOffset, byteLength) {
    const records = this.caches[byteLength - 1];
    FIND_CHUNK: for (const record of records) {
      const recordBytes = record.bytes;
      for (let j = 0; j < byteLength; j++) {
        if (recordBytes[j] !== bytes[inputOffset + j]) {
          continue FIND_CHUNK;
        }
      }
      return record.str;
    }
    return null;
  }
  store(bytes, value) {
    const records = this.caches[bytes.length - 1];
    const record = { bytes, str: value };
    if (records.length >= this.maxLengthPerKey) {
      records[Math.random() * records.length | 0] = record;
    } else {
      records.push(record);
    }
  }
  decode(bytes, inputOffset, byteLength) {
    const cachedValue = this.find(bytes, inputOffset, byteLength);
    if (cachedValue != null) {
      this.hit++;
      return cachedValue;
    }
    this.miss++;
    const str = utf8DecodeJs(bytes, inputOffset, byteLength);
    const slicedCopyOfBytes = Uint8Array.prototype.slice.call(bytes, inputOffset, inputOffset + byteLength);
    this.store(slicedCopyOfBytes, str);
    return str;
  }
};

// node_modules/@msgpack/msgpack/dist.esm/Decoder.mjs
var STATE_ARRAY = "array";
var STATE_MAP_KEY = "map_key";
var STATE_MAP_VALUE = "map_value";
var mapKeyConverter = (key) => {
  if (typeof key === "string" || typeof key === "number") {
    return key;
  }
  throw new DecodeError("The type of key must be string or number but " + typeof key);
};
var StackPool = class {
  stack = [];
  stackHeadPosition = -1;
  get length() {
    return this.stackHeadPosition + 1;
  }
  top() {
    return this.stack[this.stackHeadPosition];
  }
  pushArrayState(size) {
    const state = this.getUninitializedStateFromPool();
    state.type = STATE_ARRAY;
    state.position = 0;
    state.size = size;
    state.array = new Array(size);
  }
  pushMapState(size) {
    const state = this.getUninitializedStateFromPool();
    state.type = STATE_MAP_KEY;
    state.readCount = 0;
    state.size = size;
    state.map = {};
  }
  getUninitializedStateFromPool() {
    this.stackHeadPosition++;
    if (this.stackHeadPosition === this.stack.length) {
      const partialState = {
        type: void 0,
        size: 0,
        array: void 0,
        position: 0,
        readCount: 0,
        map: void 0,
        key: null
      };
      this.stack.push(partialState);
    }
    return this.stack[this.stackHeadPosition];
  }
  release(state) {
    const topStackState = this.stack[this.stackHeadPosition];
    if (topStackState !== state) {
      throw new Error("Invalid stack state. Released state is not on top of the stack.");
    }
    if (state.type === STATE_ARRAY) {
      const partialState = state;
      partialState.size = 0;
      partialState.array = void 0;
      partialState.position = 0;
      partialState.type = void 0;
    }
    if (state.type === STATE_MAP_KEY || state.type === STATE_MAP_VALUE) {
      const partialState = state;
      partialState.size = 0;
      partialState.map = void 0;
      partialState.readCount = 0;
      partialState.type = void 0;
    }
    this.stackHeadPosition--;
  }
  reset() {
    this.stack.length = 0;
    this.stackHeadPosition = -1;
  }
};
var HEAD_BYTE_REQUIRED = -1;
var EMPTY_VIEW = new DataView(new ArrayBuffer(0));
var EMPTY_BYTES = new Uint8Array(EMPTY_VIEW.buffer);
try {
  EMPTY_VIEW.getInt8(0);
} catch (e) {
  if (!(e instanceof RangeError)) {
    throw new Error("This module is not supported in the current JavaScript engine because DataView does not throw RangeError on out-of-bounds access");
  }
}
var MORE_DATA = new RangeError("Insufficient data");
var sharedCachedKeyDecoder = new CachedKeyDecoder();
var Decoder = class _Decoder {
  extensionCodec;
  context;
  useBigInt64;
  rawStrings;
  maxStrLength;
  maxBinLength;
  maxArrayLength;
  maxMapLength;
  maxExtLength;
  keyDecoder;
  mapKeyConverter;
  totalPos = 0;
  pos = 0;
  view = EMPTY_VIEW;
  bytes = EMPTY_BYTES;
  headByte = HEAD_BYTE_REQUIRED;
  stack = new StackPool();
  entered = false;
  constructor(options) {
    this.extensionCodec = options?.extensionCodec ?? ExtensionCodec.defaultCodec;
    this.context = options?.context;
    this.useBigInt64 = options?.useBigInt64 ?? false;
    this.rawStrings = options?.rawStrings ?? false;
    this.maxStrLength = options?.maxStrLength ?? UINT32_MAX;
    this.maxBinLength = options?.maxBinLength ?? UINT32_MAX;
    this.maxArrayLength = options?.maxArrayLength ?? UINT32_MAX;
    this.maxMapLength = options?.maxMapLength ?? UINT32_MAX;
    this.maxExtLength = options?.maxExtLength ?? UINT32_MAX;
    this.keyDecoder = options?.keyDecoder !== void 0 ? options.keyDecoder : sharedCachedKeyDecoder;
    this.mapKeyConverter = options?.mapKeyConverter ?? mapKeyConverter;
  }
  clone() {
    return new _Decoder({
      extensionCodec: this.extensionCodec,
      context: this.context,
      useBigInt64: this.useBigInt64,
      rawStrings: this.rawStrings,
      maxStrLength: this.maxStrLength,
      maxBinLength: this.maxBinLength,
      maxArrayLength: this.maxArrayLength,
      maxMapLength: this.maxMapLength,
      maxExtLength: this.maxExtLength,
      keyDecoder: this.keyDecoder
    });
  }
  reinitializeState() {
    this.totalPos = 0;
    this.headByte = HEAD_BYTE_REQUIRED;
    this.stack.reset();
  }
  setBuffer(buffer) {
    const bytes = ensureUint8Array(buffer);
    this.bytes = bytes;
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.pos = 0;
  }
  appendBuffer(buffer) {
    if (this.headByte === HEAD_BYTE_REQUIRED && !this.hasRemaining(1)) {
      this.setBuffer(buffer);
    } else {
      const remainingData = this.bytes.subarray(this.pos);
      const newData = ensureUint8Array(buffer);
      const newBuffer = new Uint8Array(remainingData.length + newData.length);
      newBuffer.set(remainingData);
      newBuffer.set(newData, remainingData.length);
      this.setBuffer(newBuffer);
    }
  }
  hasRemaining(size) {
    return this.view.byteLength - this.pos >= size;
  }
  createExtraByteError(posToShow) {
    const { view, pos } = this;
    return new RangeError(`Extra ${view.byteLength - pos} of ${view.byteLength} byte(s) found at buffer[${posToShow}]`);
  }
  /**
   * @throws {@link DecodeError}
   * @throws {@link RangeError}
   */
  decode(buffer) {
    if (this.entered) {
      const instance = this.clone();
      return instance.decode(buffer);
    }
    try {
      this.entered = true;
      this.reinitializeState();
      this.setBuffer(buffer);
      const object = this.doDecodeSync();
      if (this.hasRemaining(1)) {
        throw this.createExtraByteError(this.pos);
      }
      return object;
    } finally {
      this.entered = false;
    }
  }
  *decodeMulti(buffer) {
    if (this.entered) {
      const instance = this.clone();
      yield* instance.decodeMulti(buffer);
      return;
    }
    try {
      this.entered = true;
      this.reinitializeState();
      this.setBuffer(buffer);
      while (this.hasRemaining(1)) {
        yield this.doDecodeSync();
      }
    } finally {
      this.entered = false;
    }
  }
  async decodeAsync(stream) {
    if (this.entered) {
      const instance = this.clone();
      return instance.decodeAsync(stream);
    }
    try {
      this.entered = true;
      let decoded = false;
      let object;
      for await (const buffer of stream) {
        if (decoded) {
          this.entered = false;
          throw this.createExtraByteError(this.totalPos);
        }
        this.appendBuffer(buffer);
        try {
          object = this.doDecodeSync();
          decoded = true;
        } catch (e) {
          if (!(e instanceof RangeError)) {
            throw e;
          }
        }
        this.totalPos += this.pos;
      }
      if (decoded) {
        if (this.hasRemaining(1)) {
          throw this.createExtraByteError(this.totalPos);
        }
        return object;
      }
      const { headByte, pos, totalPos } = this;
      throw new RangeError(`Insufficient data in parsing ${prettyByte(headByte)} at ${totalPos} (${pos} in the current buffer)`);
    } finally {
      this.entered = false;
    }
  }
  decodeArrayStream(stream) {
    return this.decodeMultiAsync(stream, true);
  }
  decodeStream(stream) {
    return this.decodeMultiAsync(stream, false);
  }
  async *decodeMultiAsync(stream, isArray) {
    if (this.entered) {
      const instance = this.clone();
      yield* instance.decodeMultiAsync(stream, isArray);
      return;
    }
    try {
      this.entered = true;
      let isArrayHeaderRequired = isArray;
      let arrayItemsLeft = -1;
      for await (const buffer of stream) {
        if (isArray && arrayItemsLeft === 0) {
          throw this.createExtraByteError(this.totalPos);
        }
        this.appendBuffer(buffer);
        if (isArrayHeaderRequired) {
          arrayItemsLeft = this.readArraySize();
          isArrayHeaderRequired = false;
          this.complete();
        }
        try {
          while (true) {
            yield this.doDecodeSync();
            if (--arrayItemsLeft === 0) {
              break;
            }
          }
        } catch (e) {
          if (!(e instanceof RangeError)) {
            throw e;
          }
        }
        this.totalPos += this.pos;
      }
    } finally {
      this.entered = false;
    }
  }
  doDecodeSync() {
    DECODE: while (true) {
      const headByte = this.readHeadByte();
      let object;
      if (headByte >= 224) {
        object = headByte - 256;
      } else if (headByte < 192) {
        if (headByte < 128) {
          object = headByte;
        } else if (headByte < 144) {
          const size = headByte - 128;
          if (size !== 0) {
            this.pushMapState(size);
            this.complete();
            continue DECODE;
          } else {
            object = {};
          }
        } else if (headByte < 160) {
          const size = headByte - 144;
          if (size !== 0) {
            this.pushArrayState(size);
            this.complete();
            continue DECODE;
          } else {
            object = [];
          }
        } else {
          const byteLength = headByte - 160;
          object = this.decodeString(byteLength, 0);
        }
      } else if (headByte === 192) {
        object = null;
      } else if (headByte === 194) {
        object = false;
      } else if (headByte === 195) {
        object = true;
      } else if (headByte === 202) {
        object = this.readF32();
      } else if (headByte === 203) {
        object = this.readF64();
      } else if (headByte === 204) {
        object = this.readU8();
      } else if (headByte === 205) {
        object = this.readU16();
      } else if (headByte === 206) {
        object = this.readU32();
      } else if (headByte === 207) {
        if (this.useBigInt64) {
          object = this.readU64AsBigInt();
        } else {
          object = this.readU64();
        }
      } else if (headByte === 208) {
        object = this.readI8();
      } else if (headByte === 209) {
        object = this.readI16();
      } else if (headByte === 210) {
        object = this.readI32();
      } else if (headByte === 211) {
        if (this.useBigInt64) {
          object = this.readI64AsBigInt();
        } else {
          object = this.readI64();
        }
      } else if (headByte === 217) {
        const byteLength = this.lookU8();
        object = this.decodeString(byteLength, 1);
      } else if (headByte === 218) {
        const byteLength = this.lookU16();
        object = this.decodeString(byteLength, 2);
      } else if (headByte === 219) {
        const byteLength = this.lookU32();
        object = this.decodeString(byteLength, 4);
      } else if (headByte === 220) {
        const size = this.readU16();
        if (size !== 0) {
          this.pushArrayState(size);
          this.complete();
          continue DECODE;
        } else {
          object = [];
        }
      } else if (headByte === 221) {
        const size = this.readU32();
        if (size !== 0) {
          this.pushArrayState(size);
          this.complete();
          continue DECODE;
        } else {
          object = [];
        }
      } else if (headByte === 222) {
        const size = this.readU16();
        if (size !== 0) {
          this.pushMapState(size);
          this.complete();
          continue DECODE;
        } else {
          object = {};
        }
      } else if (headByte === 223) {
        const size = this.readU32();
        if (size !== 0) {
          this.pushMapState(size);
          this.complete();
          continue DECODE;
        } else {
          object = {};
        }
      } else if (headByte === 196) {
        const size = this.lookU8();
        object = this.decodeBinary(size, 1);
      } else if (headByte === 197) {
        const size = this.lookU16();
        object = this.decodeBinary(size, 2);
      } else if (headByte === 198) {
        const size = this.lookU32();
        object = this.decodeBinary(size, 4);
      } else if (headByte === 212) {
        object = this.decodeExtension(1, 0);
      } else if (headByte === 213) {
        object = this.decodeExtension(2, 0);
      } else if (headByte === 214) {
        object = this.decodeExtension(4, 0);
      } else if (headByte === 215) {
        object = this.decodeExtension(8, 0);
      } else if (headByte === 216) {
        object = this.decodeExtension(16, 0);
      } else if (headByte === 199) {
        const size = this.lookU8();
        object = this.decodeExtension(size, 1);
      } else if (headByte === 200) {
        const size = this.lookU16();
        object = this.decodeExtension(size, 2);
      } else if (headByte === 201) {
        const size = this.lookU32();
        object = this.decodeExtension(size, 4);
      } else {
        throw new DecodeError(`Unrecognized type byte: ${prettyByte(headByte)}`);
      }
      this.complete();
      const stack = this.stack;
      while (stack.length > 0) {
        const state = stack.top();
        if (state.type === STATE_ARRAY) {
          state.array[state.position] = object;
          state.position++;
          if (state.position === state.size) {
            object = state.array;
            stack.release(state);
          } else {
            continue DECODE;
          }
        } else if (state.type === STATE_MAP_KEY) {
          if (object === "__proto__") {
            throw new DecodeError("The key __proto__ is not allowed");
          }
          state.key = this.mapKeyConverter(object);
          state.type = STATE_MAP_VALUE;
          continue DECODE;
        } else {
          state.map[state.key] = object;
          state.readCount++;
          if (state.readCount === state.size) {
            object = state.map;
            stack.release(state);
          } else {
            state.key = null;
            state.type = STATE_MAP_KEY;
            continue DECODE;
          }
        }
      }
      return object;
    }
  }
  readHeadByte() {
    if (this.headByte === HEAD_BYTE_REQUIRED) {
      this.headByte = this.readU8();
    }
    return this.headByte;
  }
  complete() {
    this.headByte = HEAD_BYTE_REQUIRED;
  }
  readArraySize() {
    const headByte = this.readHeadByte();
    switch (headByte) {
      case 220:
        return this.readU16();
      case 221:
        return this.readU32();
      default: {
        if (headByte < 160) {
          return headByte - 144;
        } else {
          throw new DecodeError(`Unrecognized array type byte: ${prettyByte(headByte)}`);
        }
      }
    }
  }
  pushMapState(size) {
    if (size > this.maxMapLength) {
      throw new DecodeError(`Max length exceeded: map length (${size}) > maxMapLengthLength (${this.maxMapLength})`);
    }
    this.stack.pushMapState(size);
  }
  pushArrayState(size) {
    if (size > this.maxArrayLength) {
      throw new DecodeError(`Max length exceeded: array length (${size}) > maxArrayLength (${this.maxArrayLength})`);
    }
    this.stack.pushArrayState(size);
  }
  decodeString(byteLength, headerOffset) {
    if (!this.rawStrings || this.stateIsMapKey()) {
      return this.decodeUtf8String(byteLength, headerOffset);
    }
    return this.decodeBinary(byteLength, headerOffset);
  }
  /**
   * @throws {@link RangeError}
   */
  decodeUtf8String(byteLength, headerOffset) {
    if (byteLength > this.maxStrLength) {
      throw new DecodeError(`Max length exceeded: UTF-8 byte length (${byteLength}) > maxStrLength (${this.maxStrLength})`);
    }
    if (this.bytes.byteLength < this.pos + headerOffset + byteLength) {
      throw MORE_DATA;
    }
    const offset = this.pos + headerOffset;
    let object;
    if (this.stateIsMapKey() && this.keyDecoder?.canBeCached(byteLength)) {
      object = this.keyDecoder.decode(this.bytes, offset, byteLength);
    } else {
      object = utf8Decode(this.bytes, offset, byteLength);
    }
    this.pos += headerOffset + byteLength;
    return object;
  }
  stateIsMapKey() {
    if (this.stack.length > 0) {
      const state = this.stack.top();
      return state.type === STATE_MAP_KEY;
    }
    return false;
  }
  /**
   * @throws {@link RangeError}
   */
  decodeBinary(byteLength, headOffset) {
    if (byteLength > this.maxBinLength) {
      throw new DecodeError(`Max length exceeded: bin length (${byteLength}) > maxBinLength (${this.maxBinLength})`);
    }
    if (!this.hasRemaining(byteLength + headOffset)) {
      throw MORE_DATA;
    }
    const offset = this.pos + headOffset;
    const object = this.bytes.subarray(offset, offset + byteLength);
    this.pos += headOffset + byteLength;
    return object;
  }
  decodeExtension(size, headOffset) {
    if (size > this.maxExtLength) {
      throw new DecodeError(`Max length exceeded: ext length (${size}) > maxExtLength (${this.maxExtLength})`);
    }
    const extType = this.view.getInt8(this.pos + headOffset);
    const data = this.decodeBinary(
      size,
      headOffset + 1
      /* extType */
    );
    return this.extensionCodec.decode(data, extType, this.context);
  }
  lookU8() {
    return this.view.getUint8(this.pos);
  }
  lookU16() {
    return this.view.getUint16(this.pos);
  }
  lookU32() {
    return this.view.getUint32(this.pos);
  }
  readU8() {
    const value = this.view.getUint8(this.pos);
    this.pos++;
    return value;
  }
  readI8() {
    const value = this.view.getInt8(this.pos);
    this.pos++;
    return value;
  }
  readU16() {
    const value = this.view.getUint16(this.pos);
    this.pos += 2;
    return value;
  }
  readI16() {
    const value = this.view.getInt16(this.pos);
    this.pos += 2;
    return value;
  }
  readU32() {
    const value = this.view.getUint32(this.pos);
    this.pos += 4;
    return value;
  }
  readI32() {
    const value = this.view.getInt32(this.pos);
    this.pos += 4;
    return value;
  }
  readU64() {
    const value = getUint64(this.view, this.pos);
    this.pos += 8;
    return value;
  }
  readI64() {
    const value = getInt64(this.view, this.pos);
    this.pos += 8;
    return value;
  }
  readU64AsBigInt() {
    const value = this.view.getBigUint64(this.pos);
    this.pos += 8;
    return value;
  }
  readI64AsBigInt() {
    const value = this.view.getBigInt64(this.pos);
    this.pos += 8;
    return value;
  }
  readF32() {
    const value = this.view.getFloat32(this.pos);
    this.pos += 4;
    return value;
  }
  readF64() {
    const value = this.view.getFloat64(this.pos);
    this.pos += 8;
    return value;
  }
};

// src/client.ts
var HubError = class extends Error {
  constructor(message) {
    super(message);
    this.name = new.target.name;
  }
};
var ConnectionRejected = class extends HubError {
  closeCode;
  reason;
  constructor(closeCode, message, reason = "") {
    super(message);
    this.closeCode = closeCode;
    this.reason = reason;
  }
};
var CommandRejected = class extends HubError {
  code;
  index;
  retryAfter;
  thread;
  constructor(code, message, details = {}) {
    super(`${code}: ${message}`);
    this.code = code;
    if (details.index !== void 0) this.index = details.index;
    if (details.retryAfter !== void 0) this.retryAfter = details.retryAfter;
    if (details.thread !== void 0) this.thread = details.thread;
  }
};
var HubUnreachable = class extends HubError {
};
var OFFSET_RE = /^([0-9]{1,20})-([0-9]{1,20})$/;
var MAX_PART = (1n << 64n) - 1n;
var START_OFFSET = "0-0";
function offsetKey(offset) {
  const match = typeof offset === "string" ? OFFSET_RE.exec(offset) : null;
  if (match !== null) {
    const ms = BigInt(match[1]);
    const seq = BigInt(match[2]);
    if (ms <= MAX_PART && seq <= MAX_PART) return [ms, seq];
  }
  throw new HubError(`invalid offset ${JSON.stringify(offset)}: expected "<ms>-<seq>", e.g. "0-0"`);
}
function isOffset(value) {
  try {
    offsetKey(value);
    return true;
  } catch {
    return false;
  }
}
function compareOffsets(a, b) {
  return compareKeys(offsetKey(a), offsetKey(b));
}
function compareKeys(a, b) {
  if (a[0] !== b[0]) return a[0] < b[0] ? -1 : 1;
  if (a[1] !== b[1]) return a[1] < b[1] ? -1 : 1;
  return 0;
}
function isPosition(value) {
  if (typeof value !== "object" || value === null) return false;
  const { offset, epoch } = value;
  return isOffset(offset) && (epoch === null || epoch === void 0 || typeof epoch === "string");
}
function wellFormed(frame) {
  const { offset, epoch } = frame;
  return (offset === void 0 || isOffset(offset)) && (epoch === void 0 || epoch === null || typeof epoch === "string");
}
function isEventLike(value) {
  return typeof value === "object" && value !== null && !Array.isArray(value) && typeof value.type === "string";
}
var SUBPROTOCOL_JSON = "agui-hub.v1.json";
var SUBPROTOCOL_MSGPACK = "agui-hub.v1.msgpack";
var BEARER_PREFIX = "agui-hub.bearer.";
var MAX_EVENTS_PER_PUBLISH = 1e3;
var MAX_THREAD_LENGTH = 256;
var DEFAULT_MAX_BUFFER = 1e4;
var MAX_RETRY_AFTER = 3e5;
var REFRESH_SHARE = 0.2;
var REFRESH_LEAD_MAX = 6e4;
var LONGEST_TIMER = 2 ** 31 - 1;
var NO_RESUME = /* @__PURE__ */ new Set([1e3, 4401, 4403]);
var CLIENT_FAULTS = /* @__PURE__ */ new Map([
  [1002, "protocol error"],
  [1007, "invalid data"],
  [1009, "message too big"]
]);
var TOKEN_CHARS = /^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/;
var now = () => typeof performance !== "undefined" ? performance.now() : Date.now();
function describe(error) {
  if (error instanceof Error) return error.message || error.name;
  return String(error);
}
function report(what, error) {
  console.error(`agui-hub client: ${what}:`, error);
}
function backoffDelay(attempt, min, max) {
  return Math.random() * Math.min(max, min * 2 ** Math.min(attempt, 30));
}
function retryAfterMs(frame) {
  const value = frame.retryAfter;
  if (typeof value === "number" && Number.isFinite(value)) {
    return Math.min(Math.max(value * 1e3, 0), MAX_RETRY_AFTER);
  }
  return 0;
}
function jittered(wait) {
  return wait + Math.random() * (50 + 0.2 * wait);
}
function tokenExpiry(token) {
  const parts = token.split(".");
  if (parts.length !== 3) return null;
  try {
    const base64 = parts[1].replace(/-/g, "+").replace(/_/g, "/");
    const padded = base64 + "=".repeat((4 - base64.length % 4) % 4);
    const bytes = Uint8Array.from(atob(padded), (c) => c.charCodeAt(0));
    const claims = JSON.parse(new TextDecoder().decode(bytes));
    if (typeof claims === "object" && claims !== null) {
      const exp = claims.exp;
      if (typeof exp === "number" && Number.isFinite(exp)) return exp * 1e3;
    }
  } catch {
  }
  return null;
}
function checkThread(thread) {
  if (typeof thread !== "string") throw new HubError("a thread name is a string");
  const length = [...thread].length;
  if (length < 1 || length > MAX_THREAD_LENGTH) {
    throw new HubError(`a thread name is a string of 1 to ${MAX_THREAD_LENGTH} characters`);
  }
  if (/[\u0000-\u001f\u007f-\u009f]/.test(thread)) {
    throw new HubError(`thread name ${JSON.stringify(thread)} contains control characters`);
  }
  if (thread.trim() !== thread) {
    throw new HubError(
      `thread name ${JSON.stringify(thread)} begins or ends with whitespace: remove it`
    );
  }
  return thread;
}
function randomHex(bytes) {
  const data = new Uint8Array(bytes);
  const crypto = globalThis.crypto;
  if (crypto?.getRandomValues) crypto.getRandomValues(data);
  else for (let i = 0; i < bytes; i++) data[i] = Math.floor(Math.random() * 256);
  return Array.from(data, (b) => b.toString(16).padStart(2, "0")).join("");
}
var MAX_CLIENT_BYTES = 256;
var MAX_CLIENT_KEY_CHARS = 32;
var MAX_PRESENCE_LIMIT = 1e3;
function checkClientInfo(client) {
  if (client === void 0 || client === null) return void 0;
  if (typeof client !== "object" || Array.isArray(client)) {
    throw new HubError('client is a flat object, e.g. {name: "web"}');
  }
  const copy = {};
  for (const [key, value] of Object.entries(client)) {
    if (key.length < 1 || key.length > MAX_CLIENT_KEY_CHARS) {
      throw new HubError(`client keys have 1 to ${MAX_CLIENT_KEY_CHARS} characters`);
    }
    const plain = value === null || typeof value === "string" || typeof value === "boolean" || typeof value === "number" && Number.isFinite(value);
    if (!plain) {
      throw new HubError(
        `client.${key}: client is a flat object of strings, finite numbers, booleans and null`
      );
    }
    copy[key] = value;
  }
  const size = new TextEncoder().encode(JSON.stringify(copy)).length;
  if (size > MAX_CLIENT_BYTES) {
    throw new HubError(`client is ${size} bytes of JSON, over ${MAX_CLIENT_BYTES}`);
  }
  return copy;
}
function presenceEntry(value) {
  if (typeof value !== "object" || value === null) return null;
  const { connection, subject, joined, client } = value;
  if (typeof connection !== "string" || typeof subject !== "string") return null;
  const entry = { connection, subject };
  if (typeof joined === "number" && Number.isFinite(joined)) entry.joined = joined;
  if (typeof client === "object" && client !== null && !Array.isArray(client)) {
    entry.client = client;
  }
  return entry;
}
function presenceEntries(value) {
  if (!Array.isArray(value)) return [];
  return value.map(presenceEntry).filter((e) => e !== null);
}
function presenceCount(frame) {
  const count = frame.count;
  return typeof count === "number" && Number.isInteger(count) && count >= 0 ? count : 0;
}
var NO_PRESENCE = Object.freeze({
  count: 0,
  entries: [],
  more: false,
  hidden: false,
  self: null,
  off: false,
  known: false
});
function startValue(start) {
  return typeof start === "string" ? start : { offset: start.offset, epoch: start.epoch };
}
var Subscription = class {
  thread;
  #client;
  #start;
  #run;
  /** The branch followed: its latest run as received (undefined: no branch). */
  branch;
  #maxBuffer;
  #wantsPresence;
  #clientInfo;
  #handed;
  #recovered = null;
  #presence;
  // The watchers by connection id (a `left` frame names only connection and subject: the
  // rest is here).
  #watchers = /* @__PURE__ */ new Map();
  #presenceListeners = /* @__PURE__ */ new Set();
  #listeners = /* @__PURE__ */ new Set();
  #endListeners = /* @__PURE__ */ new Set();
  #buffer = [];
  #head = 0;
  #waiters = [];
  #iterating = false;
  // items are buffered for iterators
  #iteratorMade = false;
  #switchPending = false;
  #closed = false;
  #ended = false;
  #error = null;
  #errorThrown = false;
  // Receiving side, driven by the client: the position after the last item taken in,
  // the id of the subscribe whose reply is awaited (frames before it are stale), ...
  /** @internal */
  received;
  #receivedKeyOf = null;
  #receivedKey = [0n, 0n];
  /** @internal */
  awaiting = null;
  /** @internal */
  sentOn = null;
  /** @internal */
  lagged = false;
  /** @internal */
  retries = 0;
  /** @internal */
  retryTimer = null;
  #subscribedOnce = false;
  // Resubscribe from "snapshot": the gateway claimed a recovery it cannot have made
  // (another epoch), or sent a frame this subscription could not read; cleared by the
  // reply to that subscribe.
  #resync = false;
  // Frames this subscription could not read since its last good event or snapshot.
  #malformed = 0;
  /** @internal */
  constructor(client, thread, options) {
    const start = options.from ?? "live";
    if (!["live", "start", "snapshot"].includes(start) && !isPosition(start)) {
      throw new HubError('from is "live", "start", "snapshot" or {offset, epoch}');
    }
    const maxBuffer = options.maxBuffer ?? DEFAULT_MAX_BUFFER;
    if (!Number.isInteger(maxBuffer) || maxBuffer < 2) {
      throw new HubError("maxBuffer must be an integer of at least 2");
    }
    if (options.run !== void 0 && typeof options.run !== "string") {
      throw new HubError("run is a string");
    }
    if (options.branch !== void 0 && (typeof options.branch !== "string" || !options.branch)) {
      throw new HubError("branch is a run id");
    }
    if (options.run !== void 0 && options.branch !== void 0) {
      throw new HubError("run and branch do not go together");
    }
    if (options.presence !== void 0 && typeof options.presence !== "boolean") {
      throw new HubError("presence is true or false");
    }
    this.#wantsPresence = options.presence === true;
    this.#presence = this.#wantsPresence ? NO_PRESENCE : null;
    this.#clientInfo = options.client !== void 0 ? checkClientInfo(options.client) : client._clientInfo;
    this.#client = client;
    this.thread = thread;
    this.#start = typeof start === "string" ? start : { offset: start.offset, epoch: start.epoch ?? null };
    this.#run = options.run;
    this.branch = options.branch;
    this.#maxBuffer = maxBuffer;
    this.#handed = typeof this.#start === "string" ? null : this.#start;
    this.received = this.#handed;
    if (options.onItem !== void 0) this.#listeners.add(options.onItem);
    else this.#iterating = true;
  }
  /** The resume position after the last item handed out (the start until one is known). */
  get position() {
    if (this.#handed !== null) return { ...this.#handed };
    return this.#start;
  }
  /** The `recovered` flag of the latest `subscribed` item handed out. */
  get recovered() {
    return this.#recovered;
  }
  /** With `presence: true`, who watches the thread now (a new frozen object at every
   * change, as `hub.status`); null without. */
  get presence() {
    return this.#presence;
  }
  /** Call *listener* with `sub.presence` and what changed at every change, as the gateway's
   * frame arrives (not queued behind the items an iterator has not taken yet); returns the
   * unsubscribe. Only with `presence: true`. A listener that throws is reported with
   * console.error; the others still run. */
  onPresence(listener) {
    this.#presenceListeners.add(listener);
    return () => this.#presenceListeners.delete(listener);
  }
  /** Why the subscription ended (null while it runs, or after a plain close). */
  get error() {
    return this.#error;
  }
  get closed() {
    return this.#closed || this.#ended;
  }
  /** Call *listener* synchronously with each item from now on; returns the unsubscribe.
   * A listener that throws is reported with console.error; the others still run. */
  onItem(listener) {
    this.#listeners.add(listener);
    if (this.#iterating && !this.#switchPending && !this.#iteratorMade) {
      this.#switchPending = true;
      queueMicrotask(() => {
        this.#switchPending = false;
        if (this.#iteratorMade || !this.#iterating) return;
        this.#iterating = false;
        while (this.#head < this.#buffer.length) this.#handOut(this.#take(), true);
        this.#resumeIfDrained();
      });
    }
    return () => this.#listeners.delete(listener);
  }
  /** Call *listener* once when the subscription ends: with the error, or null after close(). */
  onEnd(listener) {
    if (this.#ended || this.#closed) {
      const error = this.#error;
      queueMicrotask(() => this.#callEnd(listener, error));
      return () => void 0;
    }
    this.#endListeners.add(listener);
    return () => this.#endListeners.delete(listener);
  }
  [Symbol.asyncIterator]() {
    this.#iteratorMade = true;
    this.#iterating = true;
    return {
      next: () => this.#next(),
      return: async () => {
        await this.close();
        return { done: true, value: void 0 };
      }
    };
  }
  /** Unsubscribe; iterators end (what was buffered is discarded). */
  async close() {
    if (this.#closed) return;
    this.#closed = true;
    this.#buffer = [];
    this.#head = 0;
    this.#client._remove(this);
    this.#finish(null);
  }
  // -- consumer side ----------------------------------------------------------------------------
  #next() {
    if (this.#head < this.#buffer.length) {
      const entry = this.#take();
      this.#resumeIfDrained();
      return Promise.resolve({ done: false, value: this.#handOut(entry, false) });
    }
    if (this.#error !== null && !this.#errorThrown && !this.#closed) {
      this.#errorThrown = true;
      return Promise.reject(this.#error);
    }
    if (this.#ended || this.#closed) return Promise.resolve({ done: true, value: void 0 });
    return new Promise((resolve, reject) => this.#waiters.push({ resolve, reject }));
  }
  #take() {
    const entry = this.#buffer[this.#head];
    this.#buffer[this.#head] = void 0;
    this.#head++;
    if (this.#head === this.#buffer.length) {
      this.#buffer = [];
      this.#head = 0;
    } else if (this.#head > 1024 && this.#head * 2 > this.#buffer.length) {
      this.#buffer = this.#buffer.slice(this.#head);
      this.#head = 0;
    }
    return entry;
  }
  get #buffered() {
    return this.#buffer.length - this.#head;
  }
  #handOut(entry, toListeners) {
    if (entry.position !== null) this.#handed = entry.position;
    if (entry.item.kind === "subscribed") this.#recovered = entry.item.recovered;
    if (toListeners) this.#callListeners(entry.item);
    return entry.item;
  }
  #callPresenceListeners(presence, change) {
    for (const listener of [...this.#presenceListeners]) {
      try {
        listener(presence, change, this);
      } catch (error) {
        report(`an onPresence listener of thread ${JSON.stringify(this.thread)} threw`, error);
      }
    }
  }
  #callListeners(item) {
    for (const listener of [...this.#listeners]) {
      try {
        listener(item, this);
      } catch (error) {
        report(`an onItem listener of thread ${JSON.stringify(this.thread)} threw`, error);
      }
    }
  }
  #callEnd(listener, error) {
    try {
      listener(error);
    } catch (thrown) {
      report(`an onEnd listener of thread ${JSON.stringify(this.thread)} threw`, thrown);
    }
  }
  #resumeIfDrained() {
    if (this.lagged && this.#buffered <= Math.floor(this.#maxBuffer / 2)) {
      this.lagged = false;
      this.#client._resubscribe(this);
    }
  }
  #finish(error) {
    if (this.#ended) return;
    this.#ended = true;
    if (error !== null && this.#error === null) this.#error = error;
    if (this.retryTimer !== null) this.#client._clearTimer(this.retryTimer);
    this.retryTimer = null;
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const waiter of waiters) {
      if (this.#error !== null && !this.#errorThrown && !this.#closed) {
        this.#errorThrown = true;
        waiter.reject(this.#error);
      } else {
        waiter.resolve({ done: true, value: void 0 });
      }
    }
    const listeners = [...this.#endListeners];
    this.#endListeners.clear();
    for (const listener of listeners) this.#callEnd(listener, this.#error);
  }
  // -- receiving side (called by the client) ----------------------------------------------------
  /** @internal The subscription ended: with *error*, or the client closed (null). */
  _end(error) {
    this.#finish(error);
  }
  #push(item, position) {
    if (position !== null) this.received = position;
    const entry = { item, position };
    if (!this.#iterating) {
      this.#handOut(entry, true);
      return;
    }
    const waiter = this.#waiters.shift();
    if (waiter !== void 0) {
      this.#callListeners(item);
      waiter.resolve({ done: false, value: this.#handOut(entry, false) });
      return;
    }
    this.#buffer.push(entry);
    this.#callListeners(item);
  }
  /** @internal The subscribe command to send now (from where it must resume). */
  _subscribeCommand(id) {
    this.awaiting = id;
    this.lagged = false;
    const received = this.received;
    let start;
    if (this.#resync) start = "snapshot";
    else if (received === null) start = startValue(this.#start);
    else if (received.epoch === null && received.offset === START_OFFSET) start = "start";
    else start = { offset: received.offset, epoch: received.epoch };
    const command = { type: "subscribe", id, thread: this.thread, from: start };
    if (this.#run !== void 0) command.run = this.#run;
    if (this.branch !== void 0) command.branch = this.branch;
    if (this.#wantsPresence) command.presence = true;
    if (this.#clientInfo !== void 0) command.client = this.#clientInfo;
    return command;
  }
  /** @internal A frame of this thread could not be read (a malformed frame, or one the
   * decoder refused): what it carried is lost, so resubscribe from a snapshot rather than go
   * on silently short. A second one before a good event or snapshot ends the subscription
   * with a HubError: the gateway keeps sending what this client cannot read. */
  _malformed(what) {
    if (this.#ended || this.#closed) return;
    if (++this.#malformed > 1) {
      this.#client._remove(this);
      this.#finish(
        new HubError(
          `thread ${JSON.stringify(this.thread)}: the gateway sent ${what} again after a resync from a snapshot; the subscription stopped rather than go on with a gap`
        )
      );
      return;
    }
    console.warn(
      `agui-hub client: thread ${JSON.stringify(this.thread)}: ${what}; resubscribing from a snapshot`
    );
    this.#resync = true;
    this.awaiting = 0;
    this.#client._resubscribe(this);
  }
  /** A `recovered: true` across epochs (a gateway bug, a race): offsets of one epoch mean
   * nothing in another, so resubscribe from a snapshot instead of believing it. */
  #untrusted(epoch, recovered) {
    const received = this.received;
    if (!recovered || this.#resync || received === null || received.epoch === null) return false;
    if (epoch === received.epoch) return false;
    console.warn(
      `agui-hub client: thread ${JSON.stringify(this.thread)}: the gateway answered recovered=true in epoch ${String(epoch)} to a resume from epoch ${received.epoch}; not trusted: resubscribing from a snapshot`
    );
    this.#resync = true;
    this.awaiting = 0;
    this.#client._resubscribe(this);
    return true;
  }
  /** @internal */
  _onSubscribed(frame) {
    if (this.lagged) return;
    const id = frame.id ?? null;
    if (id !== null && id !== this.awaiting) return;
    if (id === null && this.awaiting !== null) return;
    if (!wellFormed(frame)) {
      this.awaiting = null;
      this._malformed("a malformed subscribed frame");
      return;
    }
    const epoch = typeof frame.epoch === "string" ? frame.epoch : null;
    const offset = typeof frame.offset === "string" ? frame.offset : START_OFFSET;
    let recovered = frame.recovered === true;
    const received = this.received;
    let resumed;
    let position;
    if (id !== null) {
      this.awaiting = null;
      this.retries = 0;
      if (this.#untrusted(epoch, recovered)) return;
      resumed = this.#subscribedOnce;
      this.#subscribedOnce = true;
      if (this.#resync) {
        this.#resync = false;
        recovered = false;
      }
      if (!recovered) position = null;
      else if (received !== null) position = { offset: received.offset, epoch };
      else if (this.#start === "live") position = { offset, epoch };
      else if (this.#start === "start") position = { offset: START_OFFSET, epoch };
      else position = null;
    } else if (this.#untrusted(epoch, recovered)) {
      return;
    } else {
      resumed = false;
      position = recovered ? { offset: received !== null ? received.offset : offset, epoch } : null;
    }
    this.#push(
      { kind: "subscribed", thread: this.thread, epoch, offset, recovered, resumed },
      position
    );
  }
  /** @internal */
  _onSnapshot(frame) {
    if (this.awaiting !== null || this.lagged) return;
    const events = frame.events;
    if (!wellFormed(frame) || !Array.isArray(events) || !events.every((event) => isEventLike(event))) {
      this._malformed("a malformed snapshot frame");
      return;
    }
    this.#malformed = 0;
    const offset = typeof frame.offset === "string" ? frame.offset : START_OFFSET;
    const epoch = typeof frame.epoch === "string" ? frame.epoch : null;
    const complete = frame.complete !== false;
    this.#push(
      {
        kind: "snapshot",
        thread: this.thread,
        offset,
        epoch,
        complete,
        events
      },
      { offset, epoch }
    );
  }
  /** @internal Returns false when the frame could not be taken (the buffer is full). */
  _onEvent(frame) {
    if (this.awaiting !== null || this.lagged) return true;
    const offset = frame.offset;
    const event = frame.event;
    let key = null;
    try {
      if (typeof offset === "string" && isEventLike(event)) key = offsetKey(offset);
    } catch {
    }
    if (key === null) {
      this._malformed("a malformed event frame");
      return true;
    }
    const received = this.received;
    if (received !== null) {
      if (received !== this.#receivedKeyOf) {
        this.#receivedKeyOf = received;
        this.#receivedKey = offsetKey(received.offset);
      }
      if (compareKeys(key, this.#receivedKey) <= 0) return true;
    }
    if (this.#iterating && this.#buffered >= this.#maxBuffer) {
      this.lagged = true;
      return false;
    }
    this.#malformed = 0;
    if (this.branch !== void 0 && event.type === "RUN_STARTED") {
      const runId = event.runId;
      if (typeof runId === "string" && runId) this.branch = runId;
    }
    const position = { offset, epoch: received !== null ? received.epoch : null };
    this.#push(
      { kind: "event", thread: this.thread, offset, event },
      position
    );
    this.#receivedKeyOf = position;
    this.#receivedKey = key;
    return true;
  }
  /** @internal A `presence` frame without id, or a `joined` or `left` frame. */
  _onPresence(frame) {
    if (this.#presence === null || this.awaiting !== null || this.lagged) return;
    if (this.#ended || this.#closed) return;
    const type = frame.type;
    if (type !== "presence" && type !== "joined" && type !== "left") return;
    const watchers = this.#watchers;
    const count = presenceCount(frame);
    let entries = presenceEntries(frame.entries);
    let next;
    if (type === "presence") {
      watchers.clear();
      const off = frame.off === true;
      if (off) entries = [];
      for (const entry of entries) watchers.set(entry.connection, entry);
      next = {
        count: off ? 0 : count,
        entries: [...watchers.values()],
        // (Count only: nobody is named, and that is not "more".)
        more: !off && frame.hidden !== true && (frame.more === true || count > watchers.size),
        hidden: frame.hidden === true,
        self: !off && typeof frame.connection === "string" ? frame.connection : null,
        off,
        known: true
      };
    } else {
      if (type === "joined") {
        for (const entry of entries) watchers.set(entry.connection, entry);
      } else {
        entries = entries.map((entry) => {
          const kept = watchers.get(entry.connection);
          watchers.delete(entry.connection);
          return kept ?? entry;
        });
      }
      const entriesNow = [...watchers.values()];
      next = { ...this.#presence, count, entries: entriesNow, more: count > watchers.size };
    }
    this.#presence = Object.freeze(next);
    this.#callPresenceListeners(this.#presence, { change: type, count: next.count, entries });
  }
};
var HubClient = class {
  url;
  encoding;
  #subprotocol;
  #WebSocket;
  #token;
  #provider;
  #backoffMin;
  #backoffMax;
  #pingInterval;
  #pingTimeout;
  #openTimeout;
  #giveUpAfter;
  #maxFrameBytes;
  #maxPendingPublishes;
  /** @internal The `client` option, checked: what subscriptions and `auth` send. */
  _clientInfo;
  #encoder = new Encoder({ ignoreUndefined: true });
  #decoder = new Decoder({ useBigInt64: false });
  #textEncoder = new TextEncoder();
  #status;
  #statusListeners = /* @__PURE__ */ new Set();
  #ws = null;
  #open = false;
  #everOpened = false;
  #openedAt = 0;
  #lostAt;
  #lastError = null;
  // the socket's error event, for a failed handshake
  #backoffAttempt = 0;
  // grows over connections until one proves healthy
  #faulted = false;
  // a CLIENT_FAULTS close since the gateway last answered
  #refused = false;
  // the provider's last token got a 401
  #kicked = false;
  // a command cut a reconnect pause short since the gateway last answered
  #pendingPublishes = 0;
  #failure = null;
  #closed = false;
  #closing = null;
  #timers = /* @__PURE__ */ new Set();
  #retryTimer = null;
  #openTimer = null;
  #watchdog = null;
  #lastFrameAt = 0;
  #pingSentAt = -1;
  #refreshTimer = null;
  #refreshAt = null;
  // ms since the epoch
  #expires = null;
  #nextId = 1;
  #eventPrefix = randomHex(8);
  #eventCounter = 0;
  #subs = /* @__PURE__ */ new Map();
  #inflight = /* @__PURE__ */ new Map();
  // sent, awaiting a reply, by id
  #waiting = /* @__PURE__ */ new Set();
  // requests (ping, auth) waiting for a connection
  #lanes = /* @__PURE__ */ new Map();
  #unsubscribes = /* @__PURE__ */ new Map();
  constructor(options) {
    if (typeof options !== "object" || options === null) {
      throw new HubError("new HubClient({url, ...}): the options object is missing");
    }
    let parsed;
    try {
      parsed = new URL(options.url);
    } catch {
      throw new HubError(`not a WebSocket URL: ${JSON.stringify(options.url)}`);
    }
    if (parsed.protocol !== "ws:" && parsed.protocol !== "wss:") {
      throw new HubError(`not a WebSocket URL (ws:// or wss://): ${options.url}`);
    }
    this.url = options.url;
    const encoding = options.encoding ?? "msgpack";
    if (encoding !== "msgpack" && encoding !== "json") {
      throw new HubError('encoding is "msgpack" or "json"');
    }
    this.encoding = encoding;
    this.#subprotocol = encoding === "msgpack" ? SUBPROTOCOL_MSGPACK : SUBPROTOCOL_JSON;
    const constructor = options.WebSocket ?? globalThis.WebSocket ?? null;
    if (typeof constructor !== "function") {
      throw new HubError(
        "no WebSocket here: pass options.WebSocket (in Node 20: WebSocket from the ws package)"
      );
    }
    this.#WebSocket = constructor;
    const token = options.token;
    const badToken = typeof token !== "function" && (typeof token !== "string" || !token);
    if (token !== void 0 && badToken) {
      throw new HubError("token is a non-empty string or a function that returns one");
    }
    this.#token = typeof token === "string" ? token : null;
    this.#provider = typeof token === "function" ? token : null;
    const ms = (name, value, fallback) => {
      const chosen = value ?? fallback;
      if (typeof chosen !== "number" || !Number.isFinite(chosen) || chosen < 0) {
        throw new HubError(`${name} is a number of ms, at least 0`);
      }
      return chosen;
    };
    this.#backoffMin = ms("backoffMin", options.backoffMin, 500);
    this.#backoffMax = Math.max(this.#backoffMin, ms("backoffMax", options.backoffMax, 15e3));
    this.#pingInterval = Math.max(1, ms("pingInterval", options.pingInterval, 15e3));
    this.#pingTimeout = Math.max(1, ms("pingTimeout", options.pingTimeout, 1e4));
    this.#openTimeout = Math.max(1, ms("openTimeout", options.openTimeout, 1e4));
    this.#giveUpAfter = options.giveUpAfter === null || options.giveUpAfter === void 0 ? null : ms("giveUpAfter", options.giveUpAfter, 0);
    this.#maxFrameBytes = ms("maxFrameBytes", options.maxFrameBytes, 1024 * 1024);
    const pending = options.maxPendingPublishes ?? 1e3;
    if (!Number.isInteger(pending) || pending < 1) {
      throw new HubError("maxPendingPublishes is an integer of at least 1");
    }
    this.#maxPendingPublishes = pending;
    this._clientInfo = checkClientInfo(options.client);
    this.#status = Object.freeze({
      state: "connecting",
      reconnects: 0,
      attempt: 0,
      closeCode: null,
      closeReason: ""
    });
    this.#lostAt = now();
    void this.#connect();
  }
  // -- status -----------------------------------------------------------------------------------
  /** Where the connection is; a new object at every change. */
  get status() {
    return this.#status;
  }
  /** Call *listener* with the status at every transition; returns the unsubscribe. */
  onStatus(listener) {
    this.#statusListeners.add(listener);
    return () => this.#statusListeners.delete(listener);
  }
  #setStatus(patch) {
    const next = { ...this.#status, ...patch };
    if (!("error" in patch) && next.state === "open") delete next.error;
    if ("error" in patch && patch.error === void 0) delete next.error;
    this.#status = Object.freeze(next);
    for (const listener of [...this.#statusListeners]) {
      try {
        listener(this.#status);
      } catch (error) {
        report("a status listener threw", error);
      }
    }
  }
  // -- commands ---------------------------------------------------------------------------------
  /** Follow *thread*; the subscribe command goes out at once (or when connected). One
   * subscription per thread and client. */
  subscribe(thread, options = {}) {
    checkThread(thread);
    this.#usable();
    if (this.#subs.has(thread)) {
      throw new HubError(`already subscribed to thread ${JSON.stringify(thread)} on this client`);
    }
    const sub = new Subscription(this, thread, options);
    this.#subs.set(thread, sub);
    this._resubscribe(sub);
    return sub;
  }
  /** Publish *events* into *thread*; resolves with one offset per event.
   *
   * Calls about one thread are sent in call order without waiting for each other's
   * replies (pipelined); those unanswered when the connection drops are sent again after
   * the reconnect, with the same event ids and before any later one, so a drop never
   * reorders nor duplicates a thread's events. A refusal rejects with CommandRejected
   * (its `code`, and `index` for the event at fault). */
  publish(thread, events, options = {}) {
    try {
      checkThread(thread);
      this.#usable();
      if (!Array.isArray(events)) throw new HubError("events is an array of AG-UI events");
      if (events.length > MAX_EVENTS_PER_PUBLISH) {
        throw new HubError(`at most ${MAX_EVENTS_PER_PUBLISH} events per publish`);
      }
      events.forEach((event, index) => {
        if (typeof event !== "object" || event === null || typeof event.type !== "string") {
          throw new HubError(`events[${index}] is not an AG-UI event (an object with a type)`);
        }
      });
      let ids = options.eventIds;
      if (ids !== void 0) {
        if (!Array.isArray(ids) || ids.length !== events.length) {
          throw new HubError("eventIds must hold one id per event");
        }
        if (!ids.every((id) => typeof id === "string" && id.length > 0)) {
          throw new HubError("event ids are non-empty strings");
        }
        if (new Set(ids).size !== ids.length) {
          throw new HubError("eventIds must all be different (each event needs its own id)");
        }
        ids = [...ids];
      }
      if (events.length === 0) return Promise.resolve([]);
      if (this.#pendingPublishes >= this.#maxPendingPublishes) {
        const why = this.#open ? "" : " (the client is not connected)";
        throw new HubError(
          `${this.#pendingPublishes} publishes are waiting for their reply${why}, the maxPendingPublishes limit: wait for some to settle before publishing more`
        );
      }
      ids ??= this.newEventIds(events.length);
      const timeout = options.timeout === void 0 ? this.#giveUpAfter : options.timeout;
      return this.#enqueuePublish(thread, [...events], ids, timeout);
    } catch (error) {
      return Promise.reject(error);
    }
  }
  /** Round trip of a protocol ping, in ms (waits for a connection up to *timeout*). */
  async ping(options = {}) {
    const began = now();
    await this.#request({ type: "ping" }, options.timeout ?? this.#openTimeout);
    return now() - began;
  }
  /** The runs of *thread* in the order they started: its newest *limit* (default 1000,
   * at most 4096), `more` when older ones were left out. Each run names the run it
   * continues (`parentRunId`: its own, or the run before it), so they form a tree
   * (docs/protocol.md, "runs"). Rejects with a HubError `forbidden` without the read
   * grant. */
  async runs(thread, options = {}) {
    checkThread(thread);
    const command = { type: "runs", thread, limit: options.limit ?? 1e3 };
    const reply = await this.#request(command, options.timeout ?? this.#openTimeout);
    return {
      runs: Array.isArray(reply.runs) ? reply.runs : [],
      more: reply.more === true,
      agents: Array.isArray(reply.agents) ? reply.agents : []
    };
  }
  /** Who watches *thread* now, on every gateway of the store: `count`, the first *limit*
   * (default 100, at most 1000) `entries` by the time they joined, `more` when some were left
   * out, `hidden` when the gateway shows the count only. Rejects with CommandRejected
   * `presence_off` (the gateway keeps no presence) or `forbidden` (no read grant). To follow
   * the changes, subscribe with `presence: true` instead. */
  async presence(thread, options = {}) {
    checkThread(thread);
    const limit = options.limit ?? 100;
    if (!Number.isInteger(limit) || limit < 1 || limit > MAX_PRESENCE_LIMIT) {
      throw new HubError(`limit is an integer from 1 to ${MAX_PRESENCE_LIMIT}`);
    }
    const command = { type: "presence", thread, limit };
    const reply = await this.#request(command, options.timeout ?? this.#openTimeout);
    return {
      count: presenceCount(reply),
      entries: presenceEntries(reply.entries),
      more: reply.more === true,
      hidden: reply.hidden === true
    };
  }
  /** Ask the gateway to run upstream agent *agent* in *thread* (docs/bridge.md): its input
   * is built from the thread, or with `parentRunId` from the branch that ends with that run
   * (regenerate, edit), plus `messages`. Resolves with the `running` reply once the run is
   * going; its events come in the thread. Needs the publish and run grants. */
  async run(thread, agent, options = {}) {
    checkThread(thread);
    const command = { type: "run", thread, agent, messages: options.messages ?? [] };
    if (options.parentRunId !== void 0) command.parentRunId = options.parentRunId;
    if (options.runId !== void 0) command.runId = options.runId;
    return this.#request(command, options.timeout ?? this.#openTimeout);
  }
  /** Fresh event ids, unique to this client: "<random prefix>-<counter>". */
  newEventIds(count) {
    const ids = [];
    for (let i = 0; i < count; i++) ids.push(`${this.#eventPrefix}-${++this.#eventCounter}`);
    return ids;
  }
  /** Close the connection; iterators end after what they buffered, commands in flight
   * reject, every timer is cleared. */
  close() {
    if (this.#closing !== null) return this.#closing;
    this.#closed = true;
    this.#clearAllTimers();
    const ws = this.#ws;
    this.#ws = null;
    this.#open = false;
    const closed = new HubError("the client was closed");
    this.#rejectAll(closed);
    const subs = [...this.#subs.values()];
    this.#subs.clear();
    for (const sub of subs) sub._end(null);
    this.#setStatus({ state: "closed", attempt: 0 });
    this.#closing = ws === null ? Promise.resolve() : this.#shut(ws);
    return this.#closing;
  }
  // -- internals: requests ----------------------------------------------------------------------
  #usable() {
    if (this.#failure !== null) throw this.#failure;
    if (this.#closed) throw new HubError("the client is closed");
  }
  #id() {
    return this.#nextId++;
  }
  #send(ws, frame) {
    const data = this.encoding === "msgpack" ? this.#encoder.encode(frame) : JSON.stringify(frame);
    const size = typeof data !== "string" ? data.length : data.length * 3 <= this.#maxFrameBytes ? 0 : this.#textEncoder.encode(data).length;
    if (size > this.#maxFrameBytes) return size;
    try {
      ws.send(data);
    } catch (error) {
      console.warn(`agui-hub client: send failed: ${describe(error)}`);
    }
    return 0;
  }
  /** Send *out* on the open connection with a fresh id; 0, or the frame's size when it is
   * over maxFrameBytes (nothing sent). */
  #sendOutgoing(out) {
    const ws = this.#ws;
    if (out.sentOn !== null) this.#inflight.delete(out.id);
    out.id = this.#id();
    const size = this.#send(ws, { ...out.command, id: out.id });
    if (size > 0) return size;
    out.sentOn = ws;
    this.#inflight.set(out.id, out);
    return 0;
  }
  #request(command, timeout) {
    this.#usable();
    return new Promise((resolve, reject) => {
      const deadline = now() + timeout;
      let done = false;
      const finish = () => {
        if (done) return false;
        done = true;
        this.#clearTimer(timer);
        this.#waiting.delete(out);
        if (this.#inflight.get(out.id) === out) this.#inflight.delete(out.id);
        return true;
      };
      const out = {
        command,
        id: 0,
        sentOn: null,
        kind: "request",
        reply: (frame) => {
          if (finish()) resolve(frame);
        },
        error: (frame) => {
          const error = this.#commandError(frame);
          const wait = jittered(retryAfterMs(frame));
          if (error.code === "rate_limited" && now() + wait < deadline) {
            out.sentOn = null;
            this.#timer(() => {
              if (!done) this.#sendOrWait(out);
            }, wait);
            return;
          }
          if (finish()) reject(error);
        },
        fail: (error) => {
          if (finish()) reject(error);
        }
      };
      const timer = this.#timer(() => {
        out.fail(new HubUnreachable(`no reply from ${this.url} in ${timeout} ms`));
      }, timeout);
      this.#sendOrWait(out);
    });
  }
  #sendOrWait(out) {
    if (this.#closed || this.#failure !== null) return;
    if (this.#open) {
      this.#waiting.delete(out);
      this.#sendOutgoing(out);
    } else {
      this.#waiting.add(out);
      this.#kick();
    }
  }
  #commandError(frame) {
    const code = typeof frame.code === "string" ? frame.code : "error";
    const message = typeof frame.message === "string" ? frame.message : "";
    const details = {};
    if (typeof frame.index === "number" && Number.isInteger(frame.index)) {
      details.index = frame.index;
    }
    if (code === "rate_limited") details.retryAfter = retryAfterMs(frame) / 1e3;
    if (typeof frame.thread === "string") details.thread = frame.thread;
    return new CommandRejected(code, message, details);
  }
  // -- internals: publishing --------------------------------------------------------------------
  #enqueuePublish(thread, events, ids, timeout) {
    return new Promise((resolve, reject) => {
      const command = { type: "publish", thread, events, eventIds: ids };
      let lane = this.#lanes.get(thread);
      if (lane === void 0) {
        lane = [];
        this.#lanes.set(thread, lane);
      }
      const theLane = lane;
      const finish = () => {
        if (entry.done) return;
        entry.done = true;
        this.#pendingPublishes--;
        if (entry.timer !== null) this.#clearTimer(entry.timer);
        entry.timer = null;
        this.#inflight.delete(entry.id);
        const index = theLane.indexOf(entry);
        if (index >= 0) theLane.splice(index, 1);
        if (theLane.length === 0 && this.#lanes.get(thread) === theLane) this.#lanes.delete(thread);
        else this.#pump(theLane);
      };
      const entry = {
        command,
        id: 0,
        sentOn: null,
        kind: "publish",
        thread,
        held: false,
        done: false,
        attempts: 0,
        deadline: timeout === null ? null : now() + timeout,
        timer: null,
        resolve: (offsets) => {
          if (entry.done) return;
          finish();
          resolve(offsets);
        },
        fail: (error) => {
          if (entry.done) return;
          finish();
          reject(error);
        },
        reply: (frame) => {
          const offsets = frame.offsets;
          if (!Array.isArray(offsets) || offsets.length !== events.length) {
            const what = JSON.stringify(frame);
            entry.fail(new HubError(`the gateway answered a publish with ${what}`));
          } else {
            entry.resolve(offsets);
          }
        },
        error: (frame) => this.#publishRefused(entry, theLane, frame)
      };
      if (entry.deadline !== null) {
        entry.timer = this.#timer(() => {
          entry.timer = null;
          entry.fail(
            new HubUnreachable(
              `publish to ${this.url} gave up after ${timeout} ms without a reply`
            )
          );
        }, timeout);
      }
      lane.push(entry);
      this.#pendingPublishes++;
      if (this.#open) this.#pump(lane);
      else this.#kick();
    });
  }
  /** Send the lane's entries that are not sent on this connection, in order, stopping at
   * one that is paused: the gateway then receives a thread's publishes in call order. */
  #pump(lane) {
    if (!this.#open) return;
    const ws = this.#ws;
    for (const entry of [...lane]) {
      if (entry.done || entry.sentOn === ws) continue;
      if (entry.held) return;
      const size = this.#sendOutgoing(entry);
      if (size > 0) {
        entry.fail(
          new CommandRejected(
            "payload_too_large",
            `the publish frame is ${size} bytes, over maxFrameBytes (${this.#maxFrameBytes})`,
            { thread: entry.thread }
          )
        );
      }
    }
  }
  #publishRefused(entry, lane, frame) {
    const error = this.#commandError(frame);
    if (error.code !== "rate_limited" && error.code !== "store_unavailable") {
      entry.fail(error);
      return;
    }
    const delay = error.code === "rate_limited" ? jittered(retryAfterMs(frame)) : backoffDelay(entry.attempts++, this.#backoffMin, this.#backoffMax);
    if (entry.deadline !== null && now() + delay > entry.deadline) {
      entry.fail(error);
      return;
    }
    this.#inflight.delete(entry.id);
    entry.sentOn = null;
    entry.held = true;
    this.#timer(() => {
      entry.held = false;
      this.#pump(lane);
    }, delay);
  }
  // -- internals: subscriptions -----------------------------------------------------------------
  /** @internal Subscribe *sub* again from what it took in (on the open connection). */
  _resubscribe(sub) {
    if (sub.retryTimer !== null) this.#clearTimer(sub.retryTimer);
    sub.retryTimer = null;
    if (!this.#open || this.#subs.get(sub.thread) !== sub || sub.lagged) return;
    const ws = this.#ws;
    sub.sentOn = ws;
    this.#send(ws, sub._subscribeCommand(this.#id()));
  }
  /** @internal */
  _remove(sub) {
    if (sub.retryTimer !== null) this.#clearTimer(sub.retryTimer);
    sub.retryTimer = null;
    if (this.#subs.get(sub.thread) !== sub) return;
    this.#subs.delete(sub.thread);
    if (this.#open && sub.sentOn === this.#ws) this.#unsubscribe(sub.thread);
  }
  #unsubscribe(thread) {
    const id = this.#id();
    this.#unsubscribes.set(id, thread);
    this.#send(this.#ws, { type: "unsubscribe", id, thread });
  }
  // -- internals: timers ------------------------------------------------------------------------
  #timer(callback, delay) {
    const timer = setTimeout(
      () => {
        this.#timers.delete(timer);
        try {
          callback();
        } catch (error) {
          report("internal error", error);
        }
      },
      Math.min(Math.max(delay, 0), LONGEST_TIMER)
    );
    this.#timers.add(timer);
    return timer;
  }
  /** @internal */
  _clearTimer(timer) {
    this.#clearTimer(timer);
  }
  #clearTimer(timer) {
    clearTimeout(timer);
    this.#timers.delete(timer);
  }
  #clearAllTimers() {
    for (const timer of this.#timers) clearTimeout(timer);
    this.#timers.clear();
    this.#retryTimer = this.#openTimer = this.#watchdog = this.#refreshTimer = null;
    for (const sub of this.#subs.values()) sub.retryTimer = null;
  }
  // -- internals: the connection ----------------------------------------------------------------
  async #connect() {
    this.#retryTimer = null;
    if (this.#closed || this.#failure !== null) return;
    this.#setStatus({
      state: this.#everOpened ? "reconnecting" : "connecting",
      attempt: this.#status.attempt + 1
    });
    let token;
    try {
      token = await this.#tokenNow();
    } catch (error) {
      if (this.#closed || this.#failure !== null) return;
      console.warn(`agui-hub client: the token provider failed: ${describe(error)}`);
      this.#setStatus({ error: error instanceof Error ? error : new HubError(describe(error)) });
      this.#scheduleAttempt();
      return;
    }
    if (this.#closed || this.#failure !== null) return;
    const protocols = [this.#subprotocol];
    if (token !== null) {
      if (!TOKEN_CHARS.test(token)) {
        this.#fail(
          new ConnectionRejected(
            4401,
            "the token has characters a WebSocket subprotocol cannot carry"
          )
        );
        return;
      }
      protocols.push(BEARER_PREFIX + token);
    }
    let ws;
    try {
      ws = new this.#WebSocket(this.url, protocols);
    } catch (error) {
      this.#fail(new HubUnreachable(`cannot open a WebSocket to ${this.url}: ${describe(error)}`));
      return;
    }
    this.#ws = ws;
    this.#lastError = null;
    ws.binaryType = "arraybuffer";
    ws.onopen = () => this.#onOpen(ws, token);
    ws.onmessage = (event) => this.#onMessage(ws, event.data);
    ws.onerror = (event) => {
      if (ws !== this.#ws) return;
      const { message, error } = event ?? {};
      if (typeof message === "string" && message) this.#lastError = message;
      else this.#lastError = error instanceof Error ? error.message : null;
    };
    ws.onclose = (event) => this.#lost(ws, event.code, event.reason ?? "");
    this.#openTimer = this.#timer(() => {
      this.#openTimer = null;
      if (ws === this.#ws && !this.#open) {
        this.#lastError = `no WebSocket handshake in ${this.#openTimeout} ms`;
        this.#drop(ws, 1006, this.#lastError);
      }
    }, this.#openTimeout);
  }
  async #tokenNow() {
    if (this.#provider === null) return this.#token;
    const token = await this.#provider();
    if (typeof token !== "string" || !token) {
      throw new HubError(`the token provider returned ${typeof token}, not a non-empty string`);
    }
    return token;
  }
  #onOpen(ws, token) {
    if (ws !== this.#ws || this.#closed) return;
    if (this.#openTimer !== null) this.#clearTimer(this.#openTimer);
    this.#openTimer = null;
    if (ws.protocol !== this.#subprotocol) {
      this.#lastError = `${this.url} did not accept the ${this.#subprotocol} subprotocol`;
      this.#drop(ws, 1006, this.#lastError);
      return;
    }
    const reconnect = this.#everOpened;
    this.#open = true;
    this.#everOpened = true;
    this.#openedAt = now();
    this.#refused = false;
    this.#lastFrameAt = now();
    this.#pingSentAt = -1;
    this.#adopt(token, null);
    this.#setStatus({
      state: "open",
      attempt: 0,
      reconnects: this.#status.reconnects + (reconnect ? 1 : 0),
      error: void 0
    });
    if (ws !== this.#ws || !this.#open) return;
    for (const sub of [...this.#subs.values()]) {
      if (sub.sentOn !== ws) this._resubscribe(sub);
    }
    for (const lane of [...this.#lanes.values()]) this.#pump(lane);
    for (const out of [...this.#waiting]) this.#sendOrWait(out);
    this.#scheduleWatchdog(this.#pingInterval);
  }
  #onMessage(ws, data) {
    if (ws !== this.#ws || !this.#open) return;
    this.#lastFrameAt = now();
    let frame;
    try {
      if (this.encoding === "msgpack") {
        if (typeof data === "string") {
          console.warn("agui-hub client: a text frame on a msgpack connection ignored");
          return;
        }
        const bytes = data instanceof ArrayBuffer ? new Uint8Array(data) : ArrayBuffer.isView(data) ? new Uint8Array(data.buffer, data.byteOffset, data.byteLength) : null;
        if (bytes === null) {
          console.warn("agui-hub client: a frame of an unknown kind ignored");
          return;
        }
        frame = this.#decoder.decode(bytes);
      } else {
        if (typeof data !== "string") {
          console.warn("agui-hub client: a binary frame on a JSON connection ignored");
          return;
        }
        frame = JSON.parse(data);
      }
    } catch (error) {
      const why = `an undecodable frame (${describe(error)})`;
      this.#drop(ws, 1006, why);
      for (const sub of [...this.#subs.values()]) sub._malformed(why);
      return;
    }
    if (typeof frame !== "object" || frame === null || Array.isArray(frame)) return;
    try {
      this.#dispatch(frame);
    } catch (error) {
      report(`internal error handling a ${JSON.stringify(frame.type)} frame`, error);
    }
  }
  #dispatch(frame) {
    const kind = frame.type;
    const thread = frame.thread;
    const sub = typeof thread === "string" ? this.#subs.get(thread) : void 0;
    const id = typeof frame.id === "number" ? frame.id : null;
    switch (kind) {
      case "event":
        if (sub !== void 0 && !sub._onEvent(frame)) {
          if (sub.sentOn === this.#ws) this.#unsubscribe(sub.thread);
          sub.sentOn = null;
        }
        return;
      case "snapshot":
        sub?._onSnapshot(frame);
        return;
      case "joined":
      case "left":
        sub?._onPresence(frame);
        return;
      case "subscribed":
        if (sub !== void 0) {
          if (id !== null && id === sub.awaiting) this.#healthy();
          sub._onSubscribed(frame);
        }
        return;
      case "error":
        this.#onError(frame, sub, id);
        return;
      case "unsubscribed":
        if (id !== null) this.#unsubscribes.delete(id);
        return;
      case "presence":
        if (id === null) {
          sub?._onPresence(frame);
          return;
        }
      // falls through: the reply to a presence command
      default: {
        const out = id === null ? void 0 : this.#inflight.get(id);
        if (out !== void 0) {
          this.#inflight.delete(id);
          this.#healthy();
          out.reply(frame);
        }
      }
    }
  }
  #onError(frame, sub, id) {
    const code = String(frame.code);
    const message = String(frame.message ?? "");
    const out = id === null ? void 0 : this.#inflight.get(id);
    if (out !== void 0) {
      this.#inflight.delete(id);
      out.error(frame);
      return;
    }
    if (sub !== void 0 && id !== null && id === sub.awaiting) {
      if (code === "store_unavailable") {
        const low = this.#backoffMin;
        const cap = Math.max(
          low,
          Math.min(this.#backoffMax, Math.max(low, 1e3) * 2 ** Math.min(sub.retries, 30))
        );
        sub.retries++;
        this.#retrySubscribe(sub, low + Math.random() * (cap - low));
        return;
      }
      if (code === "rate_limited") {
        this.#retrySubscribe(sub, jittered(retryAfterMs(frame)));
        return;
      }
      this.#subs.delete(sub.thread);
      sub._end(this.#commandError(frame));
      return;
    }
    if (id !== null && this.#unsubscribes.has(id)) {
      const thread = this.#unsubscribes.get(id);
      this.#unsubscribes.delete(id);
      if (code === "rate_limited") {
        this.#timer(() => {
          const current = this.#subs.get(thread);
          if (this.#open && (current === void 0 || current.sentOn !== this.#ws)) {
            this.#unsubscribe(thread);
          }
        }, jittered(retryAfterMs(frame)));
      }
      return;
    }
    if (id === null && (code === "forbidden" || code === "unknown_run") && sub !== void 0) {
      this.#subs.delete(sub.thread);
      sub._end(this.#commandError(frame));
      return;
    }
    console.warn(`agui-hub client: error from the gateway: ${code} ${message}`);
  }
  #retrySubscribe(sub, delay) {
    if (sub.retryTimer !== null) this.#clearTimer(sub.retryTimer);
    sub.retryTimer = this.#timer(() => {
      sub.retryTimer = null;
      this._resubscribe(sub);
    }, delay);
  }
  /** The connection works: the next reconnect starts from the shortest pause. */
  #healthy() {
    this.#backoffAttempt = 0;
    this.#faulted = false;
    this.#kicked = false;
  }
  // -- internals: liveness ----------------------------------------------------------------------
  #scheduleWatchdog(delay) {
    if (this.#watchdog !== null) this.#clearTimer(this.#watchdog);
    this.#watchdog = this.#timer(() => {
      this.#watchdog = null;
      this.#watch();
    }, delay);
  }
  /** Browsers cannot see WebSocket pings: an app-level ping after pingInterval ms without a
   * frame, and no frame pingTimeout ms after it means the connection is dead. */
  #watch() {
    const ws = this.#ws;
    if (ws === null || !this.#open) return;
    const at = now();
    const idle = at - this.#lastFrameAt;
    const pinged = this.#pingSentAt >= this.#lastFrameAt;
    if (pinged && at - this.#pingSentAt >= this.#pingTimeout) {
      this.#drop(ws, 1006, `no frame from the gateway for ${Math.round(idle)} ms`);
      return;
    }
    if (pinged) {
      this.#scheduleWatchdog(this.#pingSentAt + this.#pingTimeout - at);
      return;
    }
    if (idle >= this.#pingInterval) {
      const id = this.#id();
      const noop = () => void 0;
      const probe = {
        command: {},
        id,
        sentOn: ws,
        kind: "probe",
        reply: noop,
        error: noop,
        fail: noop
      };
      this.#inflight.set(id, probe);
      this.#send(ws, { type: "ping", id });
      this.#pingSentAt = at;
      this.#scheduleWatchdog(this.#pingTimeout);
      return;
    }
    this.#scheduleWatchdog(this.#pingInterval - idle);
  }
  /** Give up on *ws* now (dead, or a handshake that failed), without waiting for its close. */
  #drop(ws, code, reason) {
    ws.onopen = ws.onmessage = ws.onclose = null;
    ws.onerror = () => void 0;
    try {
      ws.close();
    } catch {
    }
    ws.terminate?.();
    this.#lost(ws, code, reason);
  }
  #lost(ws, code, reason) {
    if (ws !== this.#ws) return;
    const wasOpen = this.#open;
    this.#ws = null;
    this.#open = false;
    for (const timer of [this.#openTimer, this.#watchdog, this.#refreshTimer]) {
      if (timer !== null) this.#clearTimer(timer);
    }
    this.#openTimer = this.#watchdog = this.#refreshTimer = null;
    if (this.#closed || this.#failure !== null) return;
    if (!wasOpen) {
      this.#attemptFailed();
      return;
    }
    this.#lostAt = now();
    if (this.#lostAt - this.#openedAt >= this.#backoffMax) {
      this.#healthy();
    }
    const fault = CLIENT_FAULTS.get(code);
    const sent = [...this.#inflight.values()];
    this.#inflight.clear();
    this.#unsubscribes.clear();
    for (const sub of this.#subs.values()) sub.sentOn = null;
    for (const out of sent) {
      out.sentOn = null;
      if (fault !== void 0) {
        const why = reason ? `: ${reason}` : "";
        out.error({
          type: "error",
          code: code === 1009 ? "payload_too_large" : "bad_frame",
          message: `the gateway closed the connection (${code} ${fault}${why}): it could not take a frame of this client`
        });
      } else if (out.kind === "request") {
        this.#waiting.add(out);
      }
    }
    const closed = { closeCode: code, closeReason: reason };
    if (NO_RESUME.has(code) && !(code === 4401 && this.#provider !== null)) {
      this.#fail(this.#rejected(code, reason), closed);
      return;
    }
    if (fault !== void 0) {
      if (this.#faulted) {
        this.#fail(
          new ConnectionRejected(
            code,
            `the gateway closed the connection with ${code} (${fault}) twice without answering anything in between: it refuses this client's frames; fix the client (e.g. maxFrameBytes) rather than reconnect`,
            reason
          ),
          closed
        );
        return;
      }
      this.#faulted = true;
    }
    this.#setStatus({ ...closed, state: "reconnecting", attempt: 0, error: void 0 });
    this.#scheduleAttempt();
  }
  #rejected(code, reason) {
    const why = reason ? ` (${reason})` : "";
    let message = `the gateway closed the connection with ${code}${why}`;
    if (code === 4401) {
      message += ": its credentials expired (or never came); pass token a function that returns fresh tokens, so that the client renews them and reconnects by itself";
    } else if (code === 4403) {
      message += ": its credentials were revoked; do not reconnect with them";
    } else {
      message += ": it asked the client to stop";
    }
    return new ConnectionRejected(code, message, reason);
  }
  /** A connection attempt failed before the WebSocket opened. */
  #attemptFailed() {
    const why = this.#lastError ?? "the WebSocket closed before it opened";
    const status = /Unexpected server response: (\d{3})/.exec(why)?.[1];
    if (status === "401") {
      if (this.#provider === null || this.#refused) {
        this.#fail(
          new ConnectionRejected(
            4401,
            this.#token === null && this.#provider === null ? `the gateway requires a token (HTTP 401); pass the token option` : "the gateway refused the token (HTTP 401); get a new token",
            why
          )
        );
        return;
      }
      this.#refused = true;
    } else if (status === "403") {
      this.#fail(
        new ConnectionRejected(
          4403,
          "the gateway refused the connection (HTTP 403): the credentials were revoked or this Origin is not allowed; do not retry with them",
          why
        )
      );
      return;
    }
    this.#setStatus({ error: new HubUnreachable(`cannot connect to ${this.url}: ${why}`) });
    this.#scheduleAttempt();
  }
  #scheduleAttempt() {
    if (this.#closed || this.#failure !== null) return;
    let delay = backoffDelay(this.#backoffAttempt++, this.#backoffMin, this.#backoffMax);
    if (this.#giveUpAfter !== null) {
      const left = this.#lostAt + this.#giveUpAfter - now();
      if (left <= 0) {
        const last = this.#status.error ? `: ${this.#status.error.message}` : "";
        this.#fail(
          new HubUnreachable(
            `no connection to ${this.url} for ${this.#giveUpAfter} ms; gave up${last}`
          )
        );
        return;
      }
      delay = Math.min(delay, left);
    }
    this.#retryTimer = this.#timer(() => void this.#connect(), delay);
  }
  /** A command waits for the connection: cut the reconnect pause short (backoff spares a
   * gateway nobody needs right now, not one that is wanted), once per outage: commands
   * issued in a loop must not turn the backoff into a handshake storm. */
  #kick() {
    if (this.#retryTimer === null || this.#kicked || this.#refused) return;
    this.#kicked = true;
    this.#clearTimer(this.#retryTimer);
    this.#retryTimer = null;
    void this.#connect();
  }
  // -- internals: credentials -------------------------------------------------------------------
  /** The connection's credentials are now *token* (valid until *expires*, else its exp):
   * with a provider, renew them with an `auth` command before they expire. */
  #adopt(token, expires) {
    this.#expires = expires ?? (token === null ? null : tokenExpiry(token));
    if (this.#refreshTimer !== null) this.#clearTimer(this.#refreshTimer);
    this.#refreshTimer = null;
    if (this.#expires === null || this.#provider === null) {
      this.#refreshAt = null;
      return;
    }
    const left = Math.max(0, this.#expires - Date.now());
    this.#refreshAt = this.#expires - Math.min(left * REFRESH_SHARE, REFRESH_LEAD_MAX);
    this.#scheduleRefresh();
  }
  #scheduleRefresh() {
    if (this.#refreshAt === null || !this.#open) return;
    const due = this.#refreshAt;
    this.#refreshTimer = this.#timer(() => {
      this.#refreshTimer = null;
      if (Date.now() < due) this.#scheduleRefresh();
      else void this.#refresh();
    }, due - Date.now());
  }
  async #refresh() {
    const expires = this.#expires;
    const ws = this.#ws;
    try {
      const token = await this.#tokenNow();
      const command = { type: "auth", token };
      if (this._clientInfo !== void 0) command.client = this._clientInfo;
      const reply = await this.#request(command, this.#openTimeout);
      if (reply.type !== "authenticated") throw new HubError(`auth answered ${String(reply.type)}`);
      if (this.#ws !== ws) return;
      const until = typeof reply.expires === "number" ? reply.expires * 1e3 : null;
      this.#adopt(token, until);
    } catch (error) {
      if (this.#closed || this.#failure !== null || this.#ws !== ws) return;
      console.warn(
        `agui-hub client: renewing the credentials failed (${describe(error)}); trying again shortly`
      );
      const left = expires === null ? 0 : expires - Date.now();
      const pause = left > 0 ? Math.min(1e4, Math.max(250, left / 4)) : 2e3;
      this.#refreshAt = Date.now() + pause;
      this.#scheduleRefresh();
    }
  }
  // -- internals: the end -----------------------------------------------------------------------
  /** Stop for good: everything waiting fails with *error*. */
  #fail(error, patch = {}) {
    if (this.#failure !== null || this.#closed) return;
    this.#failure = error;
    this.#clearAllTimers();
    const ws = this.#ws;
    this.#ws = null;
    this.#open = false;
    this.#rejectAll(error);
    const subs = [...this.#subs.values()];
    this.#subs.clear();
    for (const sub of subs) sub._end(error);
    this.#setStatus({ ...patch, state: "closed", error });
    if (ws !== null) void this.#shut(ws);
  }
  #rejectAll(error) {
    const lanes = [...this.#lanes.values()];
    this.#lanes.clear();
    const outs = [...lanes.flat(), ...this.#inflight.values(), ...this.#waiting];
    this.#inflight.clear();
    this.#waiting.clear();
    for (const out of outs) out.fail(error);
  }
  /** Close *ws* and wait (at most a second) for its close, so a Node process can exit. */
  #shut(ws) {
    return new Promise((resolve) => {
      ws.onopen = ws.onmessage = null;
      ws.onerror = () => void 0;
      const timer = setTimeout(() => {
        ws.terminate?.();
        resolve();
      }, 1e3);
      ws.onclose = () => {
        clearTimeout(timer);
        resolve();
      };
      try {
        ws.close(1e3);
      } catch {
        clearTimeout(timer);
        resolve();
      }
    });
  }
};
export {
  BEARER_PREFIX,
  CommandRejected,
  ConnectionRejected,
  HubClient,
  HubError,
  HubUnreachable,
  START_OFFSET,
  SUBPROTOCOL_JSON,
  SUBPROTOCOL_MSGPACK,
  Subscription,
  backoffDelay,
  checkThread,
  compareOffsets,
  isOffset,
  isPosition,
  tokenExpiry
};
