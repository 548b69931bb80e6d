// viewer.js: generated from js/src by `npm run build` (agui-hub); do not edit.
var __defProp = Object.defineProperty;
var __export = (target, all) => {
  for (var name in all)
    __defProp(target, name, { get: all[name], enumerable: true });
};

// src/viewer.ts
import {
  CommandRejected,
  ConnectionRejected,
  HubClient,
  HubError
} from "./agui-hub.js";

// node_modules/fast-json-patch/module/core.mjs
var core_exports = {};
__export(core_exports, {
  JsonPatchError: () => JsonPatchError,
  _areEquals: () => _areEquals,
  applyOperation: () => applyOperation,
  applyPatch: () => applyPatch,
  applyReducer: () => applyReducer,
  deepClone: () => deepClone,
  getValueByPointer: () => getValueByPointer,
  validate: () => validate,
  validator: () => validator
});

// node_modules/fast-json-patch/module/helpers.mjs
/*!
 * https://github.com/Starcounter-Jack/JSON-Patch
 * (c) 2017-2022 Joachim Wester
 * MIT licensed
 */
var __extends = /* @__PURE__ */ (function() {
  var extendStatics = function(d, b) {
    extendStatics = Object.setPrototypeOf || { __proto__: [] } instanceof Array && function(d2, b2) {
      d2.__proto__ = b2;
    } || function(d2, b2) {
      for (var p in b2) if (b2.hasOwnProperty(p)) d2[p] = b2[p];
    };
    return extendStatics(d, b);
  };
  return function(d, b) {
    extendStatics(d, b);
    function __() {
      this.constructor = d;
    }
    d.prototype = b === null ? Object.create(b) : (__.prototype = b.prototype, new __());
  };
})();
var _hasOwnProperty = Object.prototype.hasOwnProperty;
function hasOwnProperty(obj, key) {
  return _hasOwnProperty.call(obj, key);
}
function _objectKeys(obj) {
  if (Array.isArray(obj)) {
    var keys_1 = new Array(obj.length);
    for (var k = 0; k < keys_1.length; k++) {
      keys_1[k] = "" + k;
    }
    return keys_1;
  }
  if (Object.keys) {
    return Object.keys(obj);
  }
  var keys = [];
  for (var i in obj) {
    if (hasOwnProperty(obj, i)) {
      keys.push(i);
    }
  }
  return keys;
}
function _deepClone(obj) {
  switch (typeof obj) {
    case "object":
      return JSON.parse(JSON.stringify(obj));
    //Faster than ES5 clone - http://jsperf.com/deep-cloning-of-objects/5
    case "undefined":
      return null;
    //this is how JSON.stringify behaves for array items
    default:
      return obj;
  }
}
function isInteger(str2) {
  var i = 0;
  var len = str2.length;
  var charCode;
  while (i < len) {
    charCode = str2.charCodeAt(i);
    if (charCode >= 48 && charCode <= 57) {
      i++;
      continue;
    }
    return false;
  }
  return true;
}
function escapePathComponent(path) {
  if (path.indexOf("/") === -1 && path.indexOf("~") === -1)
    return path;
  return path.replace(/~/g, "~0").replace(/\//g, "~1");
}
function unescapePathComponent(path) {
  return path.replace(/~1/g, "/").replace(/~0/g, "~");
}
function hasUndefined(obj) {
  if (obj === void 0) {
    return true;
  }
  if (obj) {
    if (Array.isArray(obj)) {
      for (var i_1 = 0, len = obj.length; i_1 < len; i_1++) {
        if (hasUndefined(obj[i_1])) {
          return true;
        }
      }
    } else if (typeof obj === "object") {
      var objKeys = _objectKeys(obj);
      var objKeysLength = objKeys.length;
      for (var i = 0; i < objKeysLength; i++) {
        if (hasUndefined(obj[objKeys[i]])) {
          return true;
        }
      }
    }
  }
  return false;
}
function patchErrorMessageFormatter(message, args) {
  var messageParts = [message];
  for (var key in args) {
    var value = typeof args[key] === "object" ? JSON.stringify(args[key], null, 2) : args[key];
    if (typeof value !== "undefined") {
      messageParts.push(key + ": " + value);
    }
  }
  return messageParts.join("\n");
}
var PatchError = (
  /** @class */
  (function(_super) {
    __extends(PatchError2, _super);
    function PatchError2(message, name, index, operation, tree) {
      var _newTarget = this.constructor;
      var _this = _super.call(this, patchErrorMessageFormatter(message, { name, index, operation, tree })) || this;
      _this.name = name;
      _this.index = index;
      _this.operation = operation;
      _this.tree = tree;
      Object.setPrototypeOf(_this, _newTarget.prototype);
      _this.message = patchErrorMessageFormatter(message, { name, index, operation, tree });
      return _this;
    }
    return PatchError2;
  })(Error)
);

// node_modules/fast-json-patch/module/core.mjs
var JsonPatchError = PatchError;
var deepClone = _deepClone;
var objOps = {
  add: function(obj, key, document2) {
    obj[key] = this.value;
    return { newDocument: document2 };
  },
  remove: function(obj, key, document2) {
    var removed = obj[key];
    delete obj[key];
    return { newDocument: document2, removed };
  },
  replace: function(obj, key, document2) {
    var removed = obj[key];
    obj[key] = this.value;
    return { newDocument: document2, removed };
  },
  move: function(obj, key, document2) {
    var removed = getValueByPointer(document2, this.path);
    if (removed) {
      removed = _deepClone(removed);
    }
    var originalValue = applyOperation(document2, { op: "remove", path: this.from }).removed;
    applyOperation(document2, { op: "add", path: this.path, value: originalValue });
    return { newDocument: document2, removed };
  },
  copy: function(obj, key, document2) {
    var valueToCopy = getValueByPointer(document2, this.from);
    applyOperation(document2, { op: "add", path: this.path, value: _deepClone(valueToCopy) });
    return { newDocument: document2 };
  },
  test: function(obj, key, document2) {
    return { newDocument: document2, test: _areEquals(obj[key], this.value) };
  },
  _get: function(obj, key, document2) {
    this.value = obj[key];
    return { newDocument: document2 };
  }
};
var arrOps = {
  add: function(arr, i, document2) {
    if (isInteger(i)) {
      arr.splice(i, 0, this.value);
    } else {
      arr[i] = this.value;
    }
    return { newDocument: document2, index: i };
  },
  remove: function(arr, i, document2) {
    var removedList = arr.splice(i, 1);
    return { newDocument: document2, removed: removedList[0] };
  },
  replace: function(arr, i, document2) {
    var removed = arr[i];
    arr[i] = this.value;
    return { newDocument: document2, removed };
  },
  move: objOps.move,
  copy: objOps.copy,
  test: objOps.test,
  _get: objOps._get
};
function getValueByPointer(document2, pointer) {
  if (pointer == "") {
    return document2;
  }
  var getOriginalDestination = { op: "_get", path: pointer };
  applyOperation(document2, getOriginalDestination);
  return getOriginalDestination.value;
}
function applyOperation(document2, operation, validateOperation, mutateDocument, banPrototypeModifications, index) {
  if (validateOperation === void 0) {
    validateOperation = false;
  }
  if (mutateDocument === void 0) {
    mutateDocument = true;
  }
  if (banPrototypeModifications === void 0) {
    banPrototypeModifications = true;
  }
  if (index === void 0) {
    index = 0;
  }
  if (validateOperation) {
    if (typeof validateOperation == "function") {
      validateOperation(operation, 0, document2, operation.path);
    } else {
      validator(operation, 0);
    }
  }
  if (operation.path === "") {
    var returnValue = { newDocument: document2 };
    if (operation.op === "add") {
      returnValue.newDocument = operation.value;
      return returnValue;
    } else if (operation.op === "replace") {
      returnValue.newDocument = operation.value;
      returnValue.removed = document2;
      return returnValue;
    } else if (operation.op === "move" || operation.op === "copy") {
      returnValue.newDocument = getValueByPointer(document2, operation.from);
      if (operation.op === "move") {
        returnValue.removed = document2;
      }
      return returnValue;
    } else if (operation.op === "test") {
      returnValue.test = _areEquals(document2, operation.value);
      if (returnValue.test === false) {
        throw new JsonPatchError("Test operation failed", "TEST_OPERATION_FAILED", index, operation, document2);
      }
      returnValue.newDocument = document2;
      return returnValue;
    } else if (operation.op === "remove") {
      returnValue.removed = document2;
      returnValue.newDocument = null;
      return returnValue;
    } else if (operation.op === "_get") {
      operation.value = document2;
      return returnValue;
    } else {
      if (validateOperation) {
        throw new JsonPatchError("Operation `op` property is not one of operations defined in RFC-6902", "OPERATION_OP_INVALID", index, operation, document2);
      } else {
        return returnValue;
      }
    }
  } else {
    if (!mutateDocument) {
      document2 = _deepClone(document2);
    }
    var path = operation.path || "";
    var keys = path.split("/");
    var obj = document2;
    var t = 1;
    var len = keys.length;
    var existingPathFragment = void 0;
    var key = void 0;
    var validateFunction = void 0;
    if (typeof validateOperation == "function") {
      validateFunction = validateOperation;
    } else {
      validateFunction = validator;
    }
    while (true) {
      key = keys[t];
      if (key && key.indexOf("~") != -1) {
        key = unescapePathComponent(key);
      }
      if (banPrototypeModifications && (key == "__proto__" || key == "prototype" && t > 0 && keys[t - 1] == "constructor")) {
        throw new TypeError("JSON-Patch: modifying `__proto__` or `constructor/prototype` prop is banned for security reasons, if this was on purpose, please set `banPrototypeModifications` flag false and pass it to this function. More info in fast-json-patch README");
      }
      if (validateOperation) {
        if (existingPathFragment === void 0) {
          if (obj[key] === void 0) {
            existingPathFragment = keys.slice(0, t).join("/");
          } else if (t == len - 1) {
            existingPathFragment = operation.path;
          }
          if (existingPathFragment !== void 0) {
            validateFunction(operation, 0, document2, existingPathFragment);
          }
        }
      }
      t++;
      if (Array.isArray(obj)) {
        if (key === "-") {
          key = obj.length;
        } else {
          if (validateOperation && !isInteger(key)) {
            throw new JsonPatchError("Expected an unsigned base-10 integer value, making the new referenced value the array element with the zero-based index", "OPERATION_PATH_ILLEGAL_ARRAY_INDEX", index, operation, document2);
          } else if (isInteger(key)) {
            key = ~~key;
          }
        }
        if (t >= len) {
          if (validateOperation && operation.op === "add" && key > obj.length) {
            throw new JsonPatchError("The specified index MUST NOT be greater than the number of elements in the array", "OPERATION_VALUE_OUT_OF_BOUNDS", index, operation, document2);
          }
          var returnValue = arrOps[operation.op].call(operation, obj, key, document2);
          if (returnValue.test === false) {
            throw new JsonPatchError("Test operation failed", "TEST_OPERATION_FAILED", index, operation, document2);
          }
          return returnValue;
        }
      } else {
        if (t >= len) {
          var returnValue = objOps[operation.op].call(operation, obj, key, document2);
          if (returnValue.test === false) {
            throw new JsonPatchError("Test operation failed", "TEST_OPERATION_FAILED", index, operation, document2);
          }
          return returnValue;
        }
      }
      obj = obj[key];
      if (validateOperation && t < len && (!obj || typeof obj !== "object")) {
        throw new JsonPatchError("Cannot perform operation at the desired path", "OPERATION_PATH_UNRESOLVABLE", index, operation, document2);
      }
    }
  }
}
function applyPatch(document2, patch, validateOperation, mutateDocument, banPrototypeModifications) {
  if (mutateDocument === void 0) {
    mutateDocument = true;
  }
  if (banPrototypeModifications === void 0) {
    banPrototypeModifications = true;
  }
  if (validateOperation) {
    if (!Array.isArray(patch)) {
      throw new JsonPatchError("Patch sequence must be an array", "SEQUENCE_NOT_AN_ARRAY");
    }
  }
  if (!mutateDocument) {
    document2 = _deepClone(document2);
  }
  var results = new Array(patch.length);
  for (var i = 0, length_1 = patch.length; i < length_1; i++) {
    results[i] = applyOperation(document2, patch[i], validateOperation, true, banPrototypeModifications, i);
    document2 = results[i].newDocument;
  }
  results.newDocument = document2;
  return results;
}
function applyReducer(document2, operation, index) {
  var operationResult = applyOperation(document2, operation);
  if (operationResult.test === false) {
    throw new JsonPatchError("Test operation failed", "TEST_OPERATION_FAILED", index, operation, document2);
  }
  return operationResult.newDocument;
}
function validator(operation, index, document2, existingPathFragment) {
  if (typeof operation !== "object" || operation === null || Array.isArray(operation)) {
    throw new JsonPatchError("Operation is not an object", "OPERATION_NOT_AN_OBJECT", index, operation, document2);
  } else if (!objOps[operation.op]) {
    throw new JsonPatchError("Operation `op` property is not one of operations defined in RFC-6902", "OPERATION_OP_INVALID", index, operation, document2);
  } else if (typeof operation.path !== "string") {
    throw new JsonPatchError("Operation `path` property is not a string", "OPERATION_PATH_INVALID", index, operation, document2);
  } else if (operation.path.indexOf("/") !== 0 && operation.path.length > 0) {
    throw new JsonPatchError('Operation `path` property must start with "/"', "OPERATION_PATH_INVALID", index, operation, document2);
  } else if ((operation.op === "move" || operation.op === "copy") && typeof operation.from !== "string") {
    throw new JsonPatchError("Operation `from` property is not present (applicable in `move` and `copy` operations)", "OPERATION_FROM_REQUIRED", index, operation, document2);
  } else if ((operation.op === "add" || operation.op === "replace" || operation.op === "test") && operation.value === void 0) {
    throw new JsonPatchError("Operation `value` property is not present (applicable in `add`, `replace` and `test` operations)", "OPERATION_VALUE_REQUIRED", index, operation, document2);
  } else if ((operation.op === "add" || operation.op === "replace" || operation.op === "test") && hasUndefined(operation.value)) {
    throw new JsonPatchError("Operation `value` property is not present (applicable in `add`, `replace` and `test` operations)", "OPERATION_VALUE_CANNOT_CONTAIN_UNDEFINED", index, operation, document2);
  } else if (document2) {
    if (operation.op == "add") {
      var pathLen = operation.path.split("/").length;
      var existingPathLen = existingPathFragment.split("/").length;
      if (pathLen !== existingPathLen + 1 && pathLen !== existingPathLen) {
        throw new JsonPatchError("Cannot perform an `add` operation at the desired path", "OPERATION_PATH_CANNOT_ADD", index, operation, document2);
      }
    } else if (operation.op === "replace" || operation.op === "remove" || operation.op === "_get") {
      if (operation.path !== existingPathFragment) {
        throw new JsonPatchError("Cannot perform the operation at a path that does not exist", "OPERATION_PATH_UNRESOLVABLE", index, operation, document2);
      }
    } else if (operation.op === "move" || operation.op === "copy") {
      var existingValue = { op: "_get", path: operation.from, value: void 0 };
      var error = validate([existingValue], document2);
      if (error && error.name === "OPERATION_PATH_UNRESOLVABLE") {
        throw new JsonPatchError("Cannot perform the operation from a path that does not exist", "OPERATION_FROM_UNRESOLVABLE", index, operation, document2);
      }
    }
  }
}
function validate(sequence, document2, externalValidator) {
  try {
    if (!Array.isArray(sequence)) {
      throw new JsonPatchError("Patch sequence must be an array", "SEQUENCE_NOT_AN_ARRAY");
    }
    if (document2) {
      applyPatch(_deepClone(document2), _deepClone(sequence), externalValidator || true);
    } else {
      externalValidator = externalValidator || validator;
      for (var i = 0; i < sequence.length; i++) {
        externalValidator(sequence[i], i, document2, void 0);
      }
    }
  } catch (e) {
    if (e instanceof JsonPatchError) {
      return e;
    } else {
      throw e;
    }
  }
}
function _areEquals(a, b) {
  if (a === b)
    return true;
  if (a && b && typeof a == "object" && typeof b == "object") {
    var arrA = Array.isArray(a), arrB = Array.isArray(b), i, length, key;
    if (arrA && arrB) {
      length = a.length;
      if (length != b.length)
        return false;
      for (i = length; i-- !== 0; )
        if (!_areEquals(a[i], b[i]))
          return false;
      return true;
    }
    if (arrA != arrB)
      return false;
    var keys = Object.keys(a);
    length = keys.length;
    if (length !== Object.keys(b).length)
      return false;
    for (i = length; i-- !== 0; )
      if (!b.hasOwnProperty(keys[i]))
        return false;
    for (i = length; i-- !== 0; ) {
      key = keys[i];
      if (!_areEquals(a[key], b[key]))
        return false;
    }
    return true;
  }
  return a !== a && b !== b;
}

// node_modules/fast-json-patch/module/duplex.mjs
var duplex_exports = {};
__export(duplex_exports, {
  compare: () => compare,
  generate: () => generate,
  observe: () => observe,
  unobserve: () => unobserve
});
/*!
 * https://github.com/Starcounter-Jack/JSON-Patch
 * (c) 2017-2021 Joachim Wester
 * MIT license
 */
var beforeDict = /* @__PURE__ */ new WeakMap();
var Mirror = (
  /** @class */
  /* @__PURE__ */ (function() {
    function Mirror2(obj) {
      this.observers = /* @__PURE__ */ new Map();
      this.obj = obj;
    }
    return Mirror2;
  })()
);
var ObserverInfo = (
  /** @class */
  /* @__PURE__ */ (function() {
    function ObserverInfo2(callback, observer) {
      this.callback = callback;
      this.observer = observer;
    }
    return ObserverInfo2;
  })()
);
function getMirror(obj) {
  return beforeDict.get(obj);
}
function getObserverFromMirror(mirror, callback) {
  return mirror.observers.get(callback);
}
function removeObserverFromMirror(mirror, observer) {
  mirror.observers.delete(observer.callback);
}
function unobserve(root, observer) {
  observer.unobserve();
}
function observe(obj, callback) {
  var patches = [];
  var observer;
  var mirror = getMirror(obj);
  if (!mirror) {
    mirror = new Mirror(obj);
    beforeDict.set(obj, mirror);
  } else {
    var observerInfo = getObserverFromMirror(mirror, callback);
    observer = observerInfo && observerInfo.observer;
  }
  if (observer) {
    return observer;
  }
  observer = {};
  mirror.value = _deepClone(obj);
  if (callback) {
    observer.callback = callback;
    observer.next = null;
    var dirtyCheck = function() {
      generate(observer);
    };
    var fastCheck = function() {
      clearTimeout(observer.next);
      observer.next = setTimeout(dirtyCheck);
    };
    if (typeof window !== "undefined") {
      window.addEventListener("mouseup", fastCheck);
      window.addEventListener("keyup", fastCheck);
      window.addEventListener("mousedown", fastCheck);
      window.addEventListener("keydown", fastCheck);
      window.addEventListener("change", fastCheck);
    }
  }
  observer.patches = patches;
  observer.object = obj;
  observer.unobserve = function() {
    generate(observer);
    clearTimeout(observer.next);
    removeObserverFromMirror(mirror, observer);
    if (typeof window !== "undefined") {
      window.removeEventListener("mouseup", fastCheck);
      window.removeEventListener("keyup", fastCheck);
      window.removeEventListener("mousedown", fastCheck);
      window.removeEventListener("keydown", fastCheck);
      window.removeEventListener("change", fastCheck);
    }
  };
  mirror.observers.set(callback, new ObserverInfo(callback, observer));
  return observer;
}
function generate(observer, invertible) {
  if (invertible === void 0) {
    invertible = false;
  }
  var mirror = beforeDict.get(observer.object);
  _generate(mirror.value, observer.object, observer.patches, "", invertible);
  if (observer.patches.length) {
    applyPatch(mirror.value, observer.patches);
  }
  var temp = observer.patches;
  if (temp.length > 0) {
    observer.patches = [];
    if (observer.callback) {
      observer.callback(temp);
    }
  }
  return temp;
}
function _generate(mirror, obj, patches, path, invertible) {
  if (obj === mirror) {
    return;
  }
  if (typeof obj.toJSON === "function") {
    obj = obj.toJSON();
  }
  var newKeys = _objectKeys(obj);
  var oldKeys = _objectKeys(mirror);
  var changed = false;
  var deleted = false;
  for (var t = oldKeys.length - 1; t >= 0; t--) {
    var key = oldKeys[t];
    var oldVal = mirror[key];
    if (hasOwnProperty(obj, key) && !(obj[key] === void 0 && oldVal !== void 0 && Array.isArray(obj) === false)) {
      var newVal = obj[key];
      if (typeof oldVal == "object" && oldVal != null && typeof newVal == "object" && newVal != null && Array.isArray(oldVal) === Array.isArray(newVal)) {
        _generate(oldVal, newVal, patches, path + "/" + escapePathComponent(key), invertible);
      } else {
        if (oldVal !== newVal) {
          changed = true;
          if (invertible) {
            patches.push({ op: "test", path: path + "/" + escapePathComponent(key), value: _deepClone(oldVal) });
          }
          patches.push({ op: "replace", path: path + "/" + escapePathComponent(key), value: _deepClone(newVal) });
        }
      }
    } else if (Array.isArray(mirror) === Array.isArray(obj)) {
      if (invertible) {
        patches.push({ op: "test", path: path + "/" + escapePathComponent(key), value: _deepClone(oldVal) });
      }
      patches.push({ op: "remove", path: path + "/" + escapePathComponent(key) });
      deleted = true;
    } else {
      if (invertible) {
        patches.push({ op: "test", path, value: mirror });
      }
      patches.push({ op: "replace", path, value: obj });
      changed = true;
    }
  }
  if (!deleted && newKeys.length == oldKeys.length) {
    return;
  }
  for (var t = 0; t < newKeys.length; t++) {
    var key = newKeys[t];
    if (!hasOwnProperty(mirror, key) && obj[key] !== void 0) {
      patches.push({ op: "add", path: path + "/" + escapePathComponent(key), value: _deepClone(obj[key]) });
    }
  }
}
function compare(tree1, tree2, invertible) {
  if (invertible === void 0) {
    invertible = false;
  }
  var patches = [];
  _generate(tree1, tree2, patches, "", invertible);
  return patches;
}

// node_modules/fast-json-patch/index.mjs
var fast_json_patch_default = Object.assign({}, core_exports, duplex_exports, {
  JsonPatchError: PatchError,
  deepClone: _deepClone,
  escapePathComponent,
  unescapePathComponent
});

// src/transcript.ts
var CLIENT_METADATA_KEY = "@ag-ui/client";
var UNDECLARED = /* @__PURE__ */ Symbol("undeclared");
var MAX_PROBLEMS = 50;
var MAX_RAW_KEPT = 50;
function isObject(value) {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
function pyTruthy(value) {
  if (value === null || value === void 0 || value === false || value === 0 || value === "") {
    return false;
  }
  if (Array.isArray(value)) return value.length > 0;
  if (isObject(value)) return Object.keys(value).length > 0;
  return true;
}
function own(table, key) {
  return typeof key === "string" && Object.hasOwn(table, key) ? table[key] : void 0;
}
function isKey(value) {
  return value === null || ["string", "number", "boolean"].includes(typeof value);
}
function pick(event, ...keys) {
  const out = {};
  for (const key of keys) if (key in event) out[key] = event[key];
  return out;
}
function mergeMetadata(target, event) {
  if (!target || !("metadata" in event)) return;
  const existing = target.metadata;
  const incoming = event.metadata;
  target.metadata = isObject(existing) && Object.keys(existing).length > 0 ? { ...existing, ...incoming } : { ...incoming };
}
function ownMessage(message) {
  if (!isObject(message)) throw new TypeError("a message is not an object");
  const owned = { ...message };
  const calls = owned.toolCalls;
  if (calls !== void 0 && calls !== null) {
    if (!Array.isArray(calls)) throw new TypeError("toolCalls is not a list");
    owned.toolCalls = calls.map((c) => {
      const call = isObject(c) ? c : {};
      return { ...call, function: { ...isObject(call.function) ? call.function : {} } };
    });
  }
  return owned;
}
function clone(value) {
  return value === void 0 ? value : structuredClone(value);
}
var Malformed = class extends Error {
};
function need(event, key, check, what) {
  if (!(key in event)) throw new Malformed(`missing field ${key}`);
  const value = event[key];
  if (!check(value)) throw new Malformed(`${key} is not ${what}`);
  return value;
}
var str = (e, key) => need(e, key, (v) => typeof v === "string", "a string");
var anyKey = (e, key) => need(e, key, isKey, "a string");
var BASE_FIELDS = ["type", "timestamp", "rawEvent"];
var KINDS = {
  TEXT_MESSAGE_CHUNK: {
    name: "text",
    chunk: "TEXT_MESSAGE_CHUNK",
    idField: "messageId",
    start: "TEXT_MESSAGE_START",
    content: "TEXT_MESSAGE_CONTENT",
    end: "TEXT_MESSAGE_END",
    declared: /* @__PURE__ */ new Set([...BASE_FIELDS, "messageId", "role", "delta", "name", "subagentRunId", "metadata"])
  },
  TOOL_CALL_CHUNK: {
    name: "tool",
    chunk: "TOOL_CALL_CHUNK",
    idField: "toolCallId",
    start: "TOOL_CALL_START",
    content: "TOOL_CALL_ARGS",
    end: "TOOL_CALL_END",
    declared: /* @__PURE__ */ new Set([
      ...BASE_FIELDS,
      "toolCallId",
      "toolCallName",
      "parentMessageId",
      "delta",
      "subagentRunId",
      "metadata"
    ])
  },
  REASONING_MESSAGE_CHUNK: {
    name: "reasoning",
    chunk: "REASONING_MESSAGE_CHUNK",
    idField: "messageId",
    start: "REASONING_MESSAGE_START",
    content: "REASONING_MESSAGE_CONTENT",
    end: "REASONING_MESSAGE_END",
    declared: /* @__PURE__ */ new Set([...BASE_FIELDS, "messageId", "delta", "subagentRunId", "metadata"])
  }
};
var CLOSE_OWN_LANE = /* @__PURE__ */ new Set([
  "TEXT_MESSAGE_START",
  "TEXT_MESSAGE_CONTENT",
  "TEXT_MESSAGE_END",
  "TOOL_CALL_START",
  "TOOL_CALL_ARGS",
  "TOOL_CALL_END",
  "TOOL_CALL_RESULT",
  "STATE_SNAPSHOT",
  "STATE_DELTA",
  "CUSTOM",
  "STEP_STARTED",
  "STEP_FINISHED",
  "REASONING_START",
  "REASONING_MESSAGE_START",
  "REASONING_MESSAGE_CONTENT",
  "REASONING_MESSAGE_END",
  "REASONING_END"
]);
var CLOSE_ALL_LANES = /* @__PURE__ */ new Set(["RUN_STARTED", "RUN_FINISHED", "RUN_ERROR", "MESSAGES_SNAPSHOT"]);
var CLOSE_SUBAGENT_LANE = /* @__PURE__ */ new Set(["SUBAGENT_FINISHED", "SUBAGENT_ERROR"]);
var ChunkExpander = class {
  lanes = /* @__PURE__ */ new Map();
  expand(event) {
    const type = event.type;
    const kind = own(KINDS, type);
    if (kind) return this.expandChunk(kind, event);
    if (this.lanes.size === 0) return [event];
    let ends;
    if (CLOSE_ALL_LANES.has(type)) {
      ends = this.flush();
    } else if (CLOSE_OWN_LANE.has(type) || CLOSE_SUBAGENT_LANE.has(type)) {
      const lane = event.subagentRunId ?? null;
      if (lane === null && CLOSE_SUBAGENT_LANE.has(type)) return [event];
      ends = this.close(lane);
    } else {
      return [event];
    }
    ends.push(event);
    return ends;
  }
  flush() {
    const ends = [...this.lanes.values()].map(endEvent);
    this.lanes.clear();
    return ends;
  }
  close(lane) {
    const stream = this.lanes.get(lane);
    if (!stream) return [];
    this.lanes.delete(lane);
    return [endEvent(stream)];
  }
  resolveLane(kind, id, tag) {
    if (id !== null) {
      for (const [lane, stream] of this.lanes) {
        if (stream.kind === kind && stream.id === id) {
          if (tag !== null && tag !== lane) throw new Malformed(`chunk for ${id} in another lane`);
          return lane;
        }
      }
      return tag;
    }
    if (tag !== null) return tag;
    const parent = this.lanes.get(null);
    if (parent && parent.kind === kind) return null;
    const candidates = [...this.lanes].filter(([, s]) => s.kind === kind).map(([lane]) => lane);
    if (candidates.length > 1) throw new Malformed("a chunk without id could continue several streams");
    return candidates.length ? candidates[0] : null;
  }
  expandChunk(kind, chunk) {
    const id = chunk[kind.idField] ?? null;
    const lane = this.resolveLane(kind, id, chunk.subagentRunId ?? null);
    const current = this.lanes.get(lane);
    const out = [];
    let stream;
    if (current && current.kind === kind && (id === null || id === current.id)) {
      for (const [field, value] of current.established) {
        const repeated = chunk[field] ?? null;
        if (repeated !== null && repeated !== value) {
          throw new Malformed(`a continuation chunk changes ${field}`);
        }
      }
      stream = current;
    } else {
      if (id === null) throw new Malformed(`the first ${kind.chunk} has no ${kind.idField}`);
      if (kind.name === "tool" && (chunk.toolCallName ?? null) === null) {
        throw new Malformed("the first TOOL_CALL_CHUNK has no toolCallName");
      }
      if (current) {
        this.lanes.delete(lane);
        out.push(endEvent(current));
      }
      const start2 = { type: kind.start, [kind.idField]: id };
      let established = [];
      if (kind.name === "text") {
        const role = chunk.role ?? "assistant";
        const name = chunk.name ?? null;
        start2.role = role;
        if (name !== null) start2.name = name;
        established = [
          ["role", role],
          ["name", name]
        ];
      } else if (kind.name === "tool") {
        const parent = chunk.parentMessageId ?? null;
        start2.toolCallName = chunk.toolCallName;
        if (parent !== null) start2.parentMessageId = parent;
        established = [
          ["toolCallName", chunk.toolCallName],
          ["parentMessageId", parent]
        ];
      } else {
        start2.role = "reasoning";
      }
      carry(start2, chunk, lane);
      stream = { kind, id, lane, established };
      this.lanes.set(lane, stream);
      out.push(start2);
    }
    const extra = {};
    for (const [key, value] of Object.entries(chunk)) if (!kind.declared.has(key)) extra[key] = value;
    const delta = chunk.delta ?? null;
    const rawEvent = chunk.rawEvent ?? null;
    const hasExtra = Object.keys(extra).length > 0;
    if (delta !== null || rawEvent !== null || !out.length && ((chunk.metadata ?? null) !== null || hasExtra)) {
      const content = { ...extra, type: kind.content, [kind.idField]: stream.id, delta: delta ?? "" };
      carry(content, chunk, stream.lane);
      if (rawEvent !== null) content.rawEvent = rawEvent;
      out.push(content);
    } else if (hasExtra && out.length) {
      out[out.length - 1] = { ...extra, ...out[out.length - 1] };
    }
    return out;
  }
};
function carry(event, chunk, lane) {
  if (lane !== null) event.subagentRunId = lane;
  if ((chunk.timestamp ?? null) !== null) event.timestamp = chunk.timestamp;
  if ((chunk.metadata ?? null) !== null) event.metadata = chunk.metadata;
}
function endEvent(stream) {
  const end = { type: stream.kind.end, [stream.kind.idField]: stream.id };
  if (stream.lane !== null) end.subagentRunId = stream.lane;
  return end;
}
function freshChanges(reset) {
  return {
    reset,
    order: reset,
    messages: /* @__PURE__ */ new Set(),
    runs: reset,
    changedRuns: /* @__PURE__ */ new Set(),
    state: reset,
    open: reset
  };
}
var Transcript = class {
  messages = [];
  state = {};
  /** Why the shown state may be wrong (a STATE_DELTA that did not apply), else null. */
  stateProblem = null;
  runs = [];
  /** Streams still open, by id: text and reasoning messages, tool calls. */
  openMessages = /* @__PURE__ */ new Set();
  openToolCalls = /* @__PURE__ */ new Set();
  openReasoning = /* @__PURE__ */ new Set();
  openReasoningSpans = /* @__PURE__ */ new Set();
  activeSubagents = /* @__PURE__ */ new Map();
  /** Events that could not be folded (the latest few). */
  problems = [];
  problemCount = 0;
  /** Events folded since the last reset. */
  eventCount = 0;
  /** RAW and CUSTOM events since the last reset (they change nothing the transcript
   * shows: an agent framework's own events, an application's), their JSON size, and
   * the latest MAX_RAW_KEPT of them, for a view that shows them. */
  rawCount = 0;
  rawBytes = 0;
  rawEvents = [];
  chunks = new ChunkExpander();
  byId = /* @__PURE__ */ new Map();
  calls = /* @__PURE__ */ new Map();
  assistantCalls = /* @__PURE__ */ new Map();
  /** Tool results by the tool call they answer (the first one), for the view. */
  results = /* @__PURE__ */ new Map();
  /** The run a message was first seen in (for the view's grouping). */
  runOf = /* @__PURE__ */ new WeakMap();
  changes = freshChanges(true);
  /** Start over (before a snapshot's events: they replace everything). */
  reset() {
    this.messages = [];
    this.state = {};
    this.stateProblem = null;
    this.runs = [];
    this.openMessages.clear();
    this.openToolCalls.clear();
    this.openReasoning.clear();
    this.openReasoningSpans.clear();
    this.activeSubagents.clear();
    this.problems = [];
    this.problemCount = 0;
    this.eventCount = 0;
    this.rawCount = 0;
    this.rawBytes = 0;
    this.rawEvents = [];
    this.chunks = new ChunkExpander();
    this.reindex();
    this.changes = freshChanges(true);
  }
  /** What changed since the last call. */
  takeChanges() {
    const changes = this.changes;
    this.changes = freshChanges(false);
    return changes;
  }
  applyAll(events) {
    for (const event of events) this.apply(event);
  }
  /** Fold one event; never throws. Returns false when the event was not folded. */
  apply(event) {
    this.eventCount += 1;
    const type = isObject(event) && typeof event.type === "string" ? event.type : "event";
    try {
      if (!isObject(event)) throw new Malformed("an event is not an object");
      if ("metadata" in event && !isObject(event.metadata)) throw new Malformed("metadata is not an object");
      if (own(KINDS, type) && "delta" in event && typeof event.delta !== "string" && event.delta !== null) {
        throw new Malformed("delta is not a string");
      }
      for (const expanded of this.chunks.expand(event)) {
        const handler = own(HANDLERS, expanded.type);
        if (handler) handler(this, expanded);
      }
      return true;
    } catch (error) {
      this.problem(type, error instanceof Error ? error.message : String(error));
      return false;
    }
  }
  problem(type, reason) {
    this.problemCount += 1;
    this.problems.push({ type, reason });
    if (this.problems.length > MAX_PROBLEMS) this.problems.shift();
  }
  // -- queries for the view ------------------------------------------------------------------
  message(id) {
    return this.byId.get(id);
  }
  /** The tool message answering a tool call. */
  resultOf(toolCallId) {
    return this.results.get(toolCallId);
  }
  /** Whether a tool message is shown with its call (so not on its own). */
  isAttachedResult(message) {
    if (message.role !== "tool" || message.toolCallId === void 0) return false;
    return this.results.get(message.toolCallId) === message && this.calls.has(message.toolCallId);
  }
  /** The owner message of a tool call. */
  callOwner(toolCallId) {
    return this.calls.get(toolCallId)?.[0];
  }
  runFor(message) {
    return this.runOf.get(message) ?? null;
  }
  get currentRun() {
    return this.runs.length ? this.runs[this.runs.length - 1] : null;
  }
  /** A plain copy: what window.aguiViewer.model() hands out. */
  snapshot() {
    return {
      messages: clone(this.messages),
      state: clone(this.state),
      runs: clone(this.runs),
      stateProblem: this.stateProblem
    };
  }
  // -- internals ------------------------------------------------------------------------------
  touch(message) {
    if (message) this.changes.messages.add(message);
  }
  add(message) {
    this.messages.push(message);
    this.index(message);
    this.runOf.set(message, this.currentRun);
    this.changes.order = true;
    this.touch(message);
  }
  insert(at, message) {
    this.messages.splice(at, 0, message);
    this.runOf.set(message, this.currentRun);
    this.changes.order = true;
    this.touch(message);
  }
  /** A message that came in a snapshot: it belongs to the run current now, unless known. */
  adopt(message) {
    if (!this.runOf.has(message)) this.runOf.set(message, this.currentRun);
    this.touch(message);
  }
  index(message) {
    const id = message.id;
    if (isKey(id) && !this.byId.has(id)) this.byId.set(id, message);
    if (message.role === "tool" && isKey(message.toolCallId) && !this.results.has(message.toolCallId)) {
      this.results.set(message.toolCallId, message);
    }
    const calls = message.toolCalls;
    if (!Array.isArray(calls)) return;
    for (const call of calls) {
      if (!isObject(call) || !isKey(call.id)) continue;
      if (!this.calls.has(call.id)) this.calls.set(call.id, [message, call]);
      if (message.role === "assistant" && !this.assistantCalls.has(call.id)) {
        this.assistantCalls.set(call.id, [message, call]);
      }
    }
  }
  reindex() {
    this.byId = /* @__PURE__ */ new Map();
    this.calls = /* @__PURE__ */ new Map();
    this.assistantCalls = /* @__PURE__ */ new Map();
    this.results = /* @__PURE__ */ new Map();
    for (const message of this.messages) this.index(message);
    this.changes.order = true;
  }
  indexCall(owner, call) {
    if (!this.calls.has(call.id)) this.calls.set(call.id, [owner, call]);
    if (!this.assistantCalls.has(call.id)) this.assistantCalls.set(call.id, [owner, call]);
  }
  indexResult(message) {
    const first = this.byId.get(message.id);
    if (first === void 0) this.byId.set(message.id, message);
    else if (first !== message && this.messages.indexOf(first) > this.messages.indexOf(message)) {
      this.byId.set(message.id, message);
    }
    const key = message.toolCallId;
    if (isKey(key)) {
      const known = this.results.get(key);
      if (known === void 0 || this.messages.indexOf(known) > this.messages.indexOf(message)) {
        this.results.set(key, message);
      }
    }
  }
  findCall(id) {
    return this.calls.get(id);
  }
  findAssistantCall(id) {
    return this.assistantCalls.get(id);
  }
  closeEverything() {
    for (const id of [...this.openMessages, ...this.openReasoning]) this.touch(this.byId.get(id));
    for (const id of this.openToolCalls) this.touch(this.calls.get(id)?.[0]);
    this.openMessages.clear();
    this.openToolCalls.clear();
    this.openReasoning.clear();
    this.openReasoningSpans.clear();
    this.activeSubagents.clear();
    const run = this.currentRun;
    if (run) {
      for (const step of run.steps) if (step.status === "running") step.status = "interrupted";
      this.changes.changedRuns.add(run);
    }
    this.changes.open = true;
  }
  forgetRemoved() {
    const ids = new Set(this.messages.filter((m) => m.role !== "activity").map((m) => m.id));
    for (const tracked of [this.openMessages, this.openReasoning]) {
      for (const id of [...tracked]) if (!ids.has(id)) tracked.delete(id);
    }
    for (const id of [...this.openToolCalls]) if (!this.calls.has(id)) this.openToolCalls.delete(id);
    this.changes.open = true;
  }
  /** A RAW or CUSTOM event: counted, and kept among the latest. */
  noteRaw(e) {
    this.rawCount += 1;
    try {
      this.rawBytes += JSON.stringify(e).length;
    } catch {
    }
    this.rawEvents.push(e);
    if (this.rawEvents.length > MAX_RAW_KEPT) this.rawEvents.shift();
  }
  changed(part) {
    this.changes[part] = true;
  }
  /** *run* changed (its status, steps, or the sub-agents shown with it). */
  runChanged(run) {
    if (run) this.changes.changedRuns.add(run);
  }
  stepsRun() {
    let run = this.currentRun;
    if (!run) {
      run = { runId: null, parentRunId: null, status: "running", started: null, ended: null, steps: [] };
      this.runs.push(run);
      this.changes.runs = true;
    }
    return run;
  }
};
function textStart(t, e, roleDefault) {
  const id = anyKey(e, "messageId");
  let message = t.message(id);
  if (message && message.role === "activity") return void 0;
  if (!message) {
    message = { id, role: "role" in e ? e.role : roleDefault, content: "" };
    Object.assign(message, pick(e, "name", "subagentRunId"));
    t.add(message);
  }
  mergeMetadata(message, e);
  t.touch(message);
  return message;
}
function textContent(t, e) {
  const message = t.message(anyKey(e, "messageId"));
  if (!("delta" in e)) throw new Malformed("missing field delta");
  if (!message || message.role === "activity") return;
  if (typeof e.delta !== "string") throw new Malformed("delta is not a string");
  const current = message.content;
  message.content = (typeof current === "string" ? current : "") + e.delta;
  mergeMetadata(message, e);
  t.touch(message);
}
function textEnd(t, e) {
  const message = t.message(anyKey(e, "messageId"));
  if (message && message.role !== "activity") {
    mergeMetadata(message, e);
    t.touch(message);
  }
}
function toolParent(t, parentId, toolCallId) {
  let newId;
  if (parentId !== void 0 && parentId !== null) {
    const existing = t.message(parentId);
    if (existing && existing.role === "assistant") return [existing, false];
    newId = existing ? toolCallId : parentId;
  } else {
    newId = toolCallId;
  }
  const parent = { id: newId, role: "assistant", toolCalls: [] };
  t.add(parent);
  return [parent, true];
}
function endRun(t, e, status) {
  t.closeEverything();
  const run = t.currentRun;
  if (run && run.status === "running") {
    run.status = status;
    run.ended = { ...e };
    t.runChanged(run);
  } else {
    t.runs.push({
      runId: e.runId ?? null,
      parentRunId: null,
      status,
      started: null,
      ended: { ...e },
      steps: []
    });
    t.changed("runs");
  }
}
function authoritativeTypes(e) {
  const metadata = e.metadata;
  if (!isObject(metadata) || !(CLIENT_METADATA_KEY in metadata)) return UNDECLARED;
  const declared = metadata[CLIENT_METADATA_KEY];
  if (!isObject(declared)) return [];
  if (!("authoritativeActivityTypes" in declared)) return UNDECLARED;
  const types = declared.authoritativeActivityTypes;
  if (types === null) return null;
  if (Array.isArray(types) && types.every((x) => typeof x === "string")) return types;
  return [];
}
function patched(document2, patch) {
  if (!Array.isArray(patch)) throw new Malformed("a JSON Patch is a list of operations");
  return applyPatch(clone(document2), patch, true, true).newDocument;
}
function patchReason(error) {
  const message = error instanceof Error ? error.message.split("\n")[0] : String(error);
  return `JSON Patch does not apply: ${message}`;
}
var HANDLERS = {
  TEXT_MESSAGE_START(t, e) {
    const message = textStart(t, e, "assistant");
    if (message) {
      t.openMessages.add(message.id);
      t.changed("open");
    }
  },
  TEXT_MESSAGE_CONTENT: textContent,
  TEXT_MESSAGE_END(t, e) {
    textEnd(t, e);
    t.openMessages.delete(e.messageId);
    t.changed("open");
  },
  TOOL_CALL_START(t, e) {
    const id = anyKey(e, "toolCallId");
    const name = str(e, "toolCallName");
    const found = t.findCall(id);
    let owner;
    if (found) {
      let call;
      [owner, call] = found;
      call.function.name = name;
      mergeMetadata(call, e);
    } else {
      let isNew;
      [owner, isNew] = toolParent(t, e.parentMessageId, id);
      if (isNew && (e.subagentRunId ?? null) !== null && !("subagentRunId" in owner)) {
        owner.subagentRunId = e.subagentRunId;
      }
      if (owner.toolCalls === void 0 || owner.toolCalls === null) owner.toolCalls = [];
      const call = { id, type: "function", function: { name, arguments: "" } };
      owner.toolCalls.push(call);
      t.indexCall(owner, call);
      mergeMetadata(call, e);
    }
    t.openToolCalls.add(id);
    t.changed("open");
    t.touch(owner);
  },
  TOOL_CALL_ARGS(t, e) {
    const found = t.findCall(anyKey(e, "toolCallId"));
    if (!("delta" in e)) throw new Malformed("missing field delta");
    if (!found) return;
    if (typeof e.delta !== "string") throw new Malformed("delta is not a string");
    const [owner, call] = found;
    call.function.arguments = (call.function.arguments ?? "") + e.delta;
    mergeMetadata(call, e);
    t.touch(owner);
  },
  TOOL_CALL_END(t, e) {
    const id = anyKey(e, "toolCallId");
    const found = t.findCall(id);
    if (found) {
      mergeMetadata(found[1], e);
      t.touch(found[0]);
    }
    t.openToolCalls.delete(id);
    t.changed("open");
  },
  TOOL_CALL_RESULT(t, e) {
    const toolCallId = anyKey(e, "toolCallId");
    const id = anyKey(e, "messageId");
    if (!("content" in e)) throw new Malformed("missing field content");
    const message = {
      id,
      toolCallId,
      role: pyTruthy(e.role) ? e.role : "tool",
      content: e.content,
      ...pick(e, "subagentRunId")
    };
    mergeMetadata(message, e);
    const found = t.findAssistantCall(toolCallId);
    if (!found) {
      t.add(message);
      return;
    }
    const messages = t.messages;
    let at = messages.indexOf(found[0]) + 1;
    while (at < messages.length && messages[at].role === "tool") at += 1;
    t.insert(at, message);
    t.indexResult(message);
    t.touch(found[0]);
  },
  STATE_SNAPSHOT(t, e) {
    if (!("snapshot" in e)) throw new Malformed("missing field snapshot");
    t.state = e.snapshot;
    t.stateProblem = null;
    t.changed("state");
  },
  STATE_DELTA(t, e) {
    if (!("delta" in e)) throw new Malformed("missing field delta");
    try {
      t.state = patched(t.state, e.delta);
    } catch (error) {
      t.stateProblem = patchReason(error);
      t.changed("state");
      throw new Malformed(t.stateProblem);
    }
    t.changed("state");
  },
  MESSAGES_SNAPSHOT(t, e) {
    const raw = need(e, "messages", Array.isArray, "a list");
    const incoming = raw.map(ownMessage);
    for (const m of incoming) if (!isKey(m.id)) throw new Malformed("a message id is not a string");
    const byId2 = /* @__PURE__ */ new Map();
    for (const m of incoming) byId2.set(m.id, m);
    const owned = authoritativeTypes(e);
    const hasActivity = incoming.some((m) => m.role === "activity");
    const hasReasoning = incoming.some((m) => m.role === "reasoning");
    const preserved = (m) => {
      if (m.role === "activity") {
        if (Array.isArray(owned)) return !owned.includes(m.activityType);
        return owned === UNDECLARED && !hasActivity;
      }
      return m.role === "reasoning" && !hasReasoning;
    };
    const kept = t.messages.filter((m) => byId2.has(m.id) || preserved(m)).map((m) => byId2.get(m.id) ?? m);
    const keptIds = new Set(kept.map((m) => m.id));
    for (const m of incoming) if (!keptIds.has(m.id)) kept.push(m);
    t.messages = kept;
    t.reindex();
    for (const m of kept) t.adopt(m);
    t.forgetRemoved();
  },
  ACTIVITY_SNAPSHOT(t, e) {
    const id = anyKey(e, "messageId");
    const activityType = need(e, "activityType", () => true, "");
    const content = need(e, "content", () => true, "");
    const existing = t.message(id);
    const replace = "replace" in e ? pyTruthy(e.replace) : true;
    const fresh = { id, role: "activity", activityType, content, ...pick(e, "subagentRunId") };
    let target;
    if (!existing) {
      t.add(fresh);
      target = fresh;
    } else if (existing.role === "activity") {
      target = existing;
      if (replace) {
        target.activityType = activityType;
        target.content = content;
        delete target.subagentRunId;
        Object.assign(target, pick(e, "subagentRunId"));
      }
    } else if (replace) {
      t.messages[t.messages.indexOf(existing)] = target = fresh;
      t.adopt(fresh);
      t.reindex();
      t.forgetRemoved();
    } else {
      target = null;
    }
    mergeMetadata(target, e);
    t.touch(target);
  },
  ACTIVITY_DELTA(t, e) {
    const id = anyKey(e, "messageId");
    const patch = need(e, "patch", () => true, "");
    const activityType = need(e, "activityType", () => true, "");
    const current = t.message(id);
    if (!current || current.role !== "activity") return;
    const base = pyTruthy(current.content) ? current.content : {};
    try {
      current.content = patched(base, patch);
    } catch (error) {
      throw new Malformed(patchReason(error));
    }
    current.activityType = activityType;
    mergeMetadata(current, e);
    t.touch(current);
  },
  RUN_STARTED(t, e) {
    const input = e.input;
    let inputMessages = [];
    if (isObject(input) && input.messages !== void 0 && input.messages !== null) {
      if (!Array.isArray(input.messages)) throw new Malformed("input.messages is not a list");
      inputMessages = input.messages.map(ownMessage);
      if (!inputMessages.every((m) => isKey(m.id))) throw new Malformed("a message id is not a string");
    }
    t.closeEverything();
    for (const earlier of t.runs) {
      if (earlier.started && "input" in earlier.started) {
        const { input: _dropped, ...rest } = earlier.started;
        earlier.started = rest;
      }
    }
    const started = { ...e };
    if (isObject(input) && pyTruthy(input.messages)) started.input = { ...input, messages: [] };
    t.runs.push({
      runId: e.runId ?? null,
      parentRunId: e.parentRunId ?? null,
      status: "running",
      started,
      ended: null,
      steps: []
    });
    t.changed("runs");
    for (const message of inputMessages) if (!t.message(message.id)) t.add(message);
  },
  RUN_FINISHED(t, e) {
    endRun(t, e, "finished");
  },
  RAW(t, e) {
    t.noteRaw(e);
  },
  CUSTOM(t, e) {
    t.noteRaw(e);
  },
  RUN_ERROR(t, e) {
    endRun(t, e, "error");
  },
  STEP_STARTED(t, e) {
    const name = str(e, "stepName");
    const step = { name, status: "running" };
    if (typeof e.subagentRunId === "string") step.subagentRunId = e.subagentRunId;
    const run = t.stepsRun();
    run.steps.push(step);
    t.runChanged(run);
  },
  STEP_FINISHED(t, e) {
    const name = str(e, "stepName");
    const lane = e.subagentRunId ?? void 0;
    const run = t.currentRun;
    const step = run?.steps.slice().reverse().find((s) => s.name === name && s.subagentRunId === lane && s.status === "running");
    if (step) step.status = "finished";
    t.runChanged(run);
  },
  REASONING_START(t, e) {
    t.openReasoningSpans.add(anyKey(e, "messageId"));
    t.changed("open");
  },
  REASONING_END(t, e) {
    t.openReasoningSpans.delete(anyKey(e, "messageId"));
    t.changed("open");
  },
  REASONING_MESSAGE_START(t, e) {
    const message = textStart(t, { ...e, role: "reasoning" }, "reasoning");
    if (message) {
      t.openReasoning.add(message.id);
      t.changed("open");
    }
  },
  REASONING_MESSAGE_CONTENT: textContent,
  REASONING_MESSAGE_END(t, e) {
    textEnd(t, e);
    t.openReasoning.delete(e.messageId);
    t.changed("open");
  },
  REASONING_ENCRYPTED_VALUE(t, e) {
    const entity = anyKey(e, "entityId");
    const value = need(e, "encryptedValue", () => true, "");
    if (e.subtype === "tool-call") {
      const found = t.findAssistantCall(entity);
      if (found) found[1].encryptedValue = value;
      return;
    }
    const target = t.message(entity);
    if (target && target.role !== "activity") target.encryptedValue = value;
  },
  SUBAGENT_STARTED(t, e) {
    t.activeSubagents.set(anyKey(e, "subagentRunId"), { ...e });
    t.runChanged(t.currentRun);
  },
  SUBAGENT_FINISHED(t, e) {
    t.activeSubagents.delete(anyKey(e, "subagentRunId"));
    t.runChanged(t.currentRun);
  },
  SUBAGENT_ERROR(t, e) {
    t.activeSubagents.delete(anyKey(e, "subagentRunId"));
    t.runChanged(t.currentRun);
  }
};

// src/viewer.ts
var RECENT_KEY = "agui-hub.viewer.recent";
var TOKEN_KEY = "agui-hub.viewer.token";
function tokenKey(hub) {
  return `${TOKEN_KEY} ${hub}`;
}
var RECENT_MAX = 12;
var CLIENT_INFO = { name: "viewer" };
var TREE_CHILDREN_MAX = 500;
var PREVIEW_CHARS = 140;
var NO_PRESENCE = { shown: false, count: 0, subjects: [], hidden: false, off: false };
function watcherLine(entry, self) {
  const client = entry.client ? Object.values(entry.client).filter((v) => v !== null && v !== "") : [];
  const about = client.length ? ` (${client.map(String).join(" · ")})` : "";
  return `${entry.subject}${about}${entry.connection === self ? " — this page" : ""}`;
}
function branchTip(runs, tip) {
  if (runs.length === 0) return null;
  const listed = new Set(runs.map((r) => r.runId));
  const first = /* @__PURE__ */ new Map();
  for (const run of runs) {
    const parent = run.parentRunId;
    if (parent !== null && listed.has(parent) && !first.has(parent)) first.set(parent, run.runId);
  }
  let at = tip !== null && listed.has(tip) ? tip : runs[runs.length - 1].runId;
  const seen = /* @__PURE__ */ new Set([at]);
  for (let next = first.get(at); next !== void 0 && !seen.has(next); next = first.get(at)) {
    seen.add(next);
    at = next;
  }
  return at;
}
function forksOf(runs, tip) {
  const byId2 = new Map(runs.map((r) => [r.runId, r]));
  const children = /* @__PURE__ */ new Map();
  for (const run of runs) {
    const parent = run.parentRunId !== null && byId2.has(run.parentRunId) ? run.parentRunId : null;
    const list = children.get(parent) ?? [];
    list.push(run.runId);
    children.set(parent, list);
  }
  let at = branchTip(runs, tip);
  const path = [];
  const seen = /* @__PURE__ */ new Set();
  while (at !== null && byId2.has(at) && !seen.has(at)) {
    seen.add(at);
    path.push(at);
    const parent = byId2.get(at)?.parentRunId ?? null;
    at = parent !== null && byId2.has(parent) ? parent : null;
  }
  path.reverse();
  const forks = [];
  for (const run of path) {
    const info = byId2.get(run);
    const parent = info?.parentRunId !== null && info?.parentRunId !== void 0 && byId2.has(info.parentRunId) ? info.parentRunId : null;
    const versions = children.get(parent) ?? [];
    if (versions.length > 1) {
      forks.push({ run, versions, index: versions.indexOf(run), preview: info?.preview ?? "" });
    }
  }
  return forks;
}
function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== void 0) node.textContent = text;
  return node;
}
function byId(id) {
  const node = document.getElementById(id);
  if (!node) throw new Error(`the page has no #${id}`);
  return node;
}
function testId(id) {
  const node = document.querySelector(`[data-testid="${id}"]`);
  if (!node) throw new Error(`the page has no [data-testid=${id}]`);
  return node;
}
var COMPACT_JSON = 120;
function prettyJson(value) {
  const line = oneLine(value, { left: COMPACT_JSON });
  return line ?? JSON.stringify(value, null, 2);
}
function oneLine(value, budget) {
  let text;
  if (Array.isArray(value)) {
    budget.left -= 2;
    const parts = [];
    for (const item of value) {
      if (budget.left < 0) return null;
      const part = oneLine(item, budget);
      if (part === null) return null;
      parts.push(part);
      budget.left -= 2;
    }
    text = `[${parts.join(", ")}]`;
  } else if (value !== null && typeof value === "object") {
    budget.left -= 2;
    const parts = [];
    for (const [key, item] of Object.entries(value)) {
      if (item === void 0) continue;
      const name = JSON.stringify(key);
      budget.left -= name.length + 4;
      if (budget.left < 0) return null;
      const part = oneLine(item, budget);
      if (part === null) return null;
      parts.push(`${name}: ${part}`);
    }
    text = `{${parts.join(", ")}}`;
  } else {
    text = JSON.stringify(value) ?? "null";
    budget.left -= text.length;
  }
  return budget.left < 0 ? null : text;
}
function prettyText(text) {
  const trimmed = text.trim();
  if (!trimmed || !"{[".includes(trimmed[0])) return text;
  try {
    return prettyJson(JSON.parse(trimmed));
  } catch {
    return text;
  }
}
function shown(value) {
  if (typeof value === "string") return value;
  if (value === void 0) return "";
  try {
    return prettyJson(value);
  } catch {
    return String(value);
  }
}
var LiveText = class {
  node = document.createTextNode("");
  #text = "";
  set(text) {
    if (text === this.#text) return;
    if (text.startsWith(this.#text)) this.node.appendData(text.slice(this.#text.length));
    else this.node.data = text;
    this.#text = text;
  }
};
var JsonTree = class {
  root;
  #closed = /* @__PURE__ */ new Set();
  #opened = /* @__PURE__ */ new Set();
  #openDepth;
  constructor(root, openDepth = 2) {
    this.root = root;
    this.#openDepth = openDepth;
  }
  render(value) {
    const fragment = document.createDocumentFragment();
    fragment.append(this.#node(value, null, "", 0));
    this.root.replaceChildren(fragment);
  }
  #isOpen(path, depth) {
    if (this.#closed.has(path)) return false;
    return depth < this.#openDepth || this.#opened.has(path);
  }
  #node(value, key, path, depth) {
    if (value === null || typeof value !== "object") {
      const leaf = el("div", "leaf");
      if (key !== null) leaf.append(el("span", "key", key), ": ");
      const type = value === null ? "null" : typeof value;
      leaf.append(el("span", type, type === "string" ? JSON.stringify(value) : String(value)));
      return leaf;
    }
    const entries = Array.isArray(value) ? value.map((item, index) => [String(index), item]) : Object.entries(value);
    const details = el("details");
    const summary = el("summary");
    if (key !== null) summary.append(el("span", "key", key), ": ");
    const brackets = Array.isArray(value) ? ["[", "]"] : ["{", "}"];
    summary.append(el("span", "count", `${brackets[0]}${entries.length}${brackets[1]}`));
    details.append(summary);
    const fill = () => {
      if (details.childElementCount > 1) return;
      const shownEntries = entries.slice(0, TREE_CHILDREN_MAX);
      for (const [childKey, child] of shownEntries) {
        details.append(this.#node(child, childKey, `${path}/${childKey}`, depth + 1));
      }
      if (entries.length > shownEntries.length) {
        details.append(el("div", "more", `… ${entries.length - shownEntries.length} more`));
      }
    };
    if (this.#isOpen(path, depth)) {
      details.open = true;
      fill();
    }
    details.addEventListener("toggle", () => {
      if (details.open) {
        this.#closed.delete(path);
        this.#opened.add(path);
        fill();
      } else {
        this.#opened.delete(path);
        this.#closed.add(path);
      }
    });
    return details;
  }
};
var CallView = class {
  el = el("div", "call");
  #name = el("span", "call-name");
  #state = el("span", "call-state");
  #args = el("pre", "args");
  #argsText = new LiveText();
  #result = el("div", "result");
  #resultBody = el("pre", "result-body");
  #pretty = false;
  #shown = null;
  constructor() {
    const head = el("div", "call-head");
    head.append(el("span", "call-icon", "tool call"), this.#name, this.#state);
    this.#args.append(this.#argsText.node);
    this.#result.append(el("span", "result-label", "result"), this.#resultBody);
    this.#result.hidden = true;
    this.el.append(head, this.#args, this.#result);
  }
  update(call, open, result) {
    const name = call.function?.name;
    this.#name.textContent = typeof name === "string" ? name : "tool";
    const args = typeof call.function?.arguments === "string" ? call.function.arguments : "";
    const done = result !== void 0;
    const shownNow = [args, open, done, result?.content];
    if (this.#shown && this.#shown.every((part, i) => part === shownNow[i])) return;
    this.#shown = shownNow;
    this.el.dataset.open = String(open);
    this.el.dataset.done = String(done);
    this.#state.textContent = open ? "streaming arguments…" : done ? "done" : "waiting for the result…";
    if (open) {
      if (this.#pretty) {
        this.#args.replaceChildren(this.#argsText.node);
        this.#pretty = false;
      }
      this.#argsText.set(args);
    } else {
      this.#args.textContent = prettyText(args);
      this.#pretty = true;
    }
    this.#result.hidden = !done;
    if (done) this.#resultBody.textContent = prettyText(shown(result.content));
  }
};
var MessageView = class {
  el;
  #content = el("div", "content");
  #text = new LiveText();
  #who = el("div", "who");
  #calls = el("div", "calls");
  #preview = null;
  #callViews = /* @__PURE__ */ new Map();
  #tree = null;
  constructor(message) {
    const role = typeof message.role === "string" ? message.role : "message";
    if (role === "reasoning") {
      const details = el("details", "msg reasoning");
      const summary = el("summary");
      this.#who.textContent = "reasoning";
      this.#preview = el("span", "preview");
      this.#preview.dataset.noText = "";
      summary.append(this.#who, this.#preview);
      details.append(summary, this.#content);
      this.el = details;
    } else {
      this.el = el("article", "msg");
      this.el.append(this.#who, this.#content);
      if (role === "activity") {
        this.el.classList.add("activity");
        this.#tree = new JsonTree(this.#content, 3);
      } else if (role === "tool") {
        this.el.classList.add("tool");
      }
      this.el.append(this.#calls);
    }
    this.el.dataset.role = role;
    this.#content.append(this.#text.node);
  }
  update(message, model) {
    const role = typeof message.role === "string" ? message.role : "message";
    const id = message.id;
    const name = typeof message.name === "string" ? ` · ${message.name}` : "";
    const subagent = typeof message.subagentRunId === "string" ? ` · ${message.subagentRunId}` : "";
    if (role === "activity") {
      this.#who.textContent = `activity · ${shown(message.activityType)}${subagent}`;
      this.#tree?.render(message.content ?? {});
      return;
    }
    if (role === "tool") {
      this.#who.textContent = `tool result${name}${subagent}`;
      this.#text.set(prettyText(shown(message.content)));
      return;
    }
    if (role !== "reasoning") this.#who.textContent = `${role}${name}${subagent}`;
    const streaming = model.openMessages.has(id) || model.openReasoning.has(id);
    this.el.dataset.streaming = String(streaming);
    const text = shown(message.content);
    this.#text.set(text);
    if (this.#preview) {
      this.#who.textContent = streaming ? "reasoning…" : "reasoning";
      this.#preview.textContent = text.length > PREVIEW_CHARS ? `…${text.slice(-PREVIEW_CHARS)}` : text;
    }
    const calls = Array.isArray(message.toolCalls) ? message.toolCalls : [];
    const seen = /* @__PURE__ */ new Set();
    const order = [];
    for (const call of calls) {
      if (call === null || typeof call !== "object" || seen.has(call)) continue;
      seen.add(call);
      let view = this.#callViews.get(call);
      if (!view) {
        view = new CallView();
        this.#callViews.set(call, view);
      }
      order.push(view.el);
      view.update(call, model.openToolCalls.has(call.id), model.resultOf(call.id));
    }
    for (const call of [...this.#callViews.keys()]) if (!seen.has(call)) this.#callViews.delete(call);
    reorder(this.#calls, order);
  }
};
var RunView = class {
  el = el("section", "run");
  body = el("div", "run-body");
  #title = el("span", "run-title");
  #status = el("span", "run-status");
  #steps = el("span", "steps");
  #error = el("div", "run-error");
  #result = el("details", "run-result");
  #resultTree;
  constructor() {
    const head = el("div", "run-head");
    head.append(this.#title, this.#status, this.#steps, this.#error);
    const summary = el("summary", void 0, "result");
    const tree = el("div", "json-tree");
    this.#result.append(summary, tree);
    this.#resultTree = new JsonTree(tree, 1);
    this.el.append(head, this.body, this.#result);
  }
  update(run, active, latest) {
    if (run === null) {
      this.el.dataset.status = "none";
      this.#title.textContent = "before any run";
      this.#status.hidden = true;
      this.#error.hidden = true;
      this.#result.hidden = true;
      return;
    }
    this.el.dataset.status = run.status;
    const parent = run.parentRunId ? ` (from ${run.parentRunId})` : "";
    this.#title.textContent = `run ${run.runId ?? "?"}${parent}`;
    this.#status.hidden = false;
    this.#status.textContent = run.status;
    const chips = run.steps.map((step) => {
      const chip = el("span", "step", step.subagentRunId ? `${step.subagentRunId}: ${step.name}` : step.name);
      chip.dataset.status = step.status;
      chip.title = `step ${step.status}`;
      return chip;
    });
    if (latest) {
      for (const id of active.keys()) {
        const chip = el("span", "step", `subagent ${id}`);
        chip.dataset.status = "running";
        chips.push(chip);
      }
    }
    this.#steps.replaceChildren(...chips);
    const ended = run.ended ?? {};
    const message = run.status === "error" ? shown(ended.message ?? "the run failed") : "";
    this.#error.hidden = !message;
    this.#error.textContent = message ? `error: ${message}${ended.code ? ` (${shown(ended.code)})` : ""}` : "";
    const hasResult = run.status === "finished" && ended.result !== void 0;
    this.#result.hidden = !hasResult;
    if (hasResult) this.#resultTree.render(ended.result);
  }
};
var TranscriptView = class {
  root;
  #messages = /* @__PURE__ */ new Map();
  #runs = /* @__PURE__ */ new Map();
  #newRuns = [];
  // views #layout made, not filled in yet
  #latest = null;
  // the latest run at the last render
  #empty;
  /** The "‹ 2 of 3 ›" switches, by the run each is a version of. */
  #forks = /* @__PURE__ */ new Map();
  /** The switches of runs the transcript does not show (trimmed, or not arrived yet). */
  #unplaced = el("div", "forks-unplaced");
  /** The id of the question a run answered, if known. */
  #questionOf;
  /** Each message id's view, as of the last layout. */
  #messageById = /* @__PURE__ */ new Map();
  constructor(root, questionOf) {
    this.root = root;
    this.#questionOf = questionOf;
    this.#empty = el("div", "empty");
    this.root.replaceChildren(this.#unplaced, this.#empty);
  }
  setEmptyText(parts) {
    this.#empty.replaceChildren(...parts);
  }
  clear() {
    this.#messages.clear();
    this.#runs.clear();
    this.root.replaceChildren(this.#unplaced, this.#empty);
  }
  setForks(forks) {
    for (const [run, fork] of this.#forks) if (forks.get(run) !== fork) fork.remove();
    this.#forks = forks;
    this.#placeForks();
  }
  /** Each switch where the versions differ: on its run's question when the run's section
   * shows it, else over the section's first message; at the top of the transcript while
   * the run has no section. */
  #placeForks() {
    const sections = /* @__PURE__ */ new Map();
    for (const [run, view] of this.#runs) {
      if (run?.runId && !sections.has(run.runId)) sections.set(run.runId, view);
    }
    const unplaced = [];
    for (const [run, fork] of this.#forks) {
      const view = sections.get(run);
      const question = this.#questionOf(run);
      const on = question !== null ? this.#messageById.get(question) : void 0;
      if (!view) {
        unplaced.push(fork);
      } else if (on && on.parentNode === view.body && on.dataset.role === "user") {
        if (fork.parentNode !== on || fork.nextSibling) on.append(fork);
      } else if (fork.parentNode !== view.el || fork.nextSibling !== view.body) {
        view.el.insertBefore(fork, view.body);
      }
    }
    reorder(this.#unplaced, unplaced);
  }
  render(model) {
    const changes = model.takeChanges();
    if (changes.reset) this.clear();
    const created = changes.reset || changes.order || changes.runs ? this.#layout(model) : [];
    const updated = changes.reset ? new Set(model.messages) : changes.messages;
    for (const message of created) updated.add(message);
    for (const message of updated) {
      const view = this.#messages.get(message);
      if (view) view.update(message, model);
      else if (model.isAttachedResult(message)) {
        const owner = model.callOwner(message.toolCallId);
        if (owner) this.#messages.get(owner)?.update(owner, model);
      }
    }
    const latest = model.currentRun;
    const runs = /* @__PURE__ */ new Set([...this.#newRuns, ...changes.changedRuns]);
    if (changes.runs || changes.open || changes.reset) {
      runs.add(this.#latest);
      runs.add(latest);
    }
    for (const run of runs) this.#runs.get(run)?.update(run, model.activeSubagents, run === latest);
    this.#newRuns = [];
    this.#latest = latest;
  }
  /** Put every message's view in its run's section, in the model's order; returns the
   * messages whose views are new. */
  #layout(model) {
    const created = [];
    const wanted = /* @__PURE__ */ new Map();
    for (const run of model.runs) wanted.set(run, []);
    const alive = /* @__PURE__ */ new Set();
    this.#messageById = /* @__PURE__ */ new Map();
    for (const message of model.messages) {
      if (model.isAttachedResult(message)) continue;
      let view = this.#messages.get(message);
      if (!view) {
        view = new MessageView(message);
        this.#messages.set(message, view);
        created.push(message);
      }
      alive.add(message);
      this.#messageById.set(message.id, view.el);
      const run = model.runFor(message);
      const key = run !== null && wanted.has(run) ? run : null;
      if (!wanted.has(key)) wanted.set(key, []);
      wanted.get(key).push(view.el);
    }
    for (const message of [...this.#messages.keys()]) {
      if (!alive.has(message)) this.#messages.delete(message);
    }
    const sections = [];
    const order = wanted.has(null) ? [null, ...model.runs] : [...model.runs];
    for (const run of order) {
      let view = this.#runs.get(run);
      if (!view) {
        view = new RunView();
        this.#runs.set(run, view);
        this.#newRuns.push(run);
      }
      reorder(view.body, wanted.get(run) ?? []);
      sections.push(view.el);
    }
    for (const run of [...this.#runs.keys()]) if (!wanted.has(run)) this.#runs.delete(run);
    if (!sections.length) sections.push(this.#empty);
    reorder(this.root, [this.#unplaced, ...sections]);
    this.#placeForks();
    return created;
  }
};
function reorder(parent, children) {
  let cursor = parent.firstChild;
  for (const child of children) {
    if (cursor === child) {
      cursor = cursor.nextSibling;
    } else {
      parent.insertBefore(child, cursor);
    }
  }
  while (cursor) {
    const next = cursor.nextSibling;
    parent.removeChild(cursor);
    cursor = next;
  }
}
function kilobytes(size) {
  return size < 1e3 ? `${size} B` : `${(size / 1e3).toFixed(1)} kB`;
}
function safeJson(value) {
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}
function textOf(root) {
  const lines = [];
  let line = "";
  const blocks = /* @__PURE__ */ new Set(["DIV", "SECTION", "ARTICLE", "DETAILS", "SUMMARY", "PRE", "HEADER", "P"]);
  const walk = (node) => {
    if (node.nodeType === Node.TEXT_NODE) {
      line += node.data;
      return;
    }
    if (node.nodeType !== Node.ELEMENT_NODE) return;
    const element = node;
    if ("noText" in element.dataset) return;
    if (element.hidden) return;
    const block = blocks.has(element.tagName);
    if (block && line) {
      lines.push(line);
      line = "";
    }
    for (let child = element.firstChild; child; child = child.nextSibling) walk(child);
    if (block && line) {
      lines.push(line);
      line = "";
    } else if (!block && line && !line.endsWith(" ")) {
      line += " ";
    }
  };
  walk(root);
  if (line) lines.push(line);
  return lines.map((l) => l.trimEnd()).filter((l) => l).join("\n");
}
function hubUrl() {
  const param = new URLSearchParams(location.search).get("hub");
  if (param) {
    const url2 = new URL(param, location.href);
    if (url2.protocol === "http:") url2.protocol = "ws:";
    if (url2.protocol === "https:") url2.protocol = "wss:";
    return url2.href;
  }
  const url = new URL(".", location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  url.search = "";
  url.hash = "";
  return url.href;
}
function readHash() {
  return new URLSearchParams(location.hash.replace(/^#/, ""));
}
function storage(kind) {
  try {
    return kind === "local" ? window.localStorage : window.sessionStorage;
  } catch {
    return null;
  }
}
function recentThreads() {
  try {
    const list = JSON.parse(storage("local")?.getItem(RECENT_KEY) ?? "[]");
    return Array.isArray(list) ? list.filter((t) => typeof t === "string") : [];
  } catch {
    return [];
  }
}
function rememberThread(thread) {
  const list = [thread, ...recentThreads().filter((t) => t !== thread)].slice(0, RECENT_MAX);
  try {
    storage("local")?.setItem(RECENT_KEY, JSON.stringify(list));
  } catch {
  }
}
function threadProblem(thread) {
  if (!thread) return "type a thread id";
  if (thread.length > 256) return "a thread id has at most 256 characters";
  if (/[\u0000-\u001f\u007f-\u009f]/.test(thread)) return "a thread id has no control characters";
  return null;
}
var Viewer = class {
  model = new Transcript();
  connection;
  #view;
  #state;
  #client = null;
  #sub = null;
  #frame = 0;
  #generation = 0;
  #stateShown = void 0;
  #presence = NO_PRESENCE;
  #threadInput = byId("thread");
  #encoding = byId("encoding");
  #token = byId("token");
  #recent = byId("recent-threads");
  #indicator = byId("connection");
  #status = testId("status");
  #reconnects = testId("reconnects");
  #resume = testId("resume");
  #watching = testId("watching");
  #notice = byId("notice");
  #stateProblem = byId("state-problem");
  #eventsLine = byId("events-line");
  #rawPanel = byId("raw-events");
  #rawList = byId("raw-list");
  /** RAW and CUSTOM events: "short" (counted on the events line), "hide", "full" (listed). */
  #rawMode = "short";
  #rawShown = -1;
  /** The thread's runs (the runs command), refreshed when a run starts or ends. */
  #runs = [];
  #forks = [];
  #runsAsked = 0;
  /** The agents this page may run in the thread (the runs reply): regenerate and edit. */
  #agents = [];
  /** Each run's RUN_STARTED as received (its input holds the question it answered). */
  #starts = /* @__PURE__ */ new Map();
  #actions = byId("run-actions");
  constructor() {
    this.#view = new TranscriptView(testId("transcript"), (run) => {
      const id = this.#question(run)?.id;
      return typeof id === "string" ? id : null;
    });
    this.#state = new JsonTree(byId("state"), 3);
    this.connection = {
      state: "idle",
      attempt: 0,
      reconnects: 0,
      closeCode: null,
      closeReason: "",
      error: null,
      hub: "",
      encoding: "msgpack",
      thread: null,
      from: "start",
      subscribed: false,
      stopped: null,
      resumes: [],
      snapshots: 0,
      trimmed: false,
      items: 0,
      branch: null
    };
    try {
      this.connection.hub = hubUrl();
    } catch {
      this.#notify("error", "the hub parameter is not a URL: use ?hub=ws://host:port/");
    }
    if (new URLSearchParams(location.search).has("hub") && this.connection.hub) {
      const hub = byId("hub");
      hub.textContent = `hub ${new URL(this.connection.hub).host}`;
      hub.title = this.connection.hub;
      hub.hidden = false;
    }
    this.#token.value = storage("session")?.getItem(tokenKey(this.connection.hub)) ?? "";
    this.#fillRecent();
    byId("thread-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.#setHash({ thread: this.#threadInput.value.trim() });
    });
    this.#encoding.addEventListener("change", () => this.#setHash({ encoding: this.#encoding.value }));
    byId("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const token = this.#token.value.trim();
      const key = tokenKey(this.connection.hub);
      if (token) storage("session")?.setItem(key, token);
      else storage("session")?.removeItem(key);
      byId("token-box").open = false;
      this.#connect();
    });
    window.addEventListener("hashchange", () => this.#fromHash());
    this.#showEmpty();
    this.#fromHash();
  }
  // -- what tests (and curious people) can read: window.aguiViewer ----------------------------
  snapshot() {
    return {
      ...this.model.snapshot(),
      connection: structuredClone(this.connection),
      forks: structuredClone(this.#forks),
      presence: structuredClone(this.#presence)
    };
  }
  transcriptText() {
    this.#render();
    return textOf(this.#view.root);
  }
  // -- settings --------------------------------------------------------------------------------------
  #setHash(changes) {
    const params = readHash();
    for (const [key, value] of Object.entries(changes)) {
      if (value) params.set(key, value);
      else params.delete(key);
    }
    if (params.get("encoding") === "msgpack") params.delete("encoding");
    const hash = `#${params.toString()}`;
    if (hash !== location.hash) location.hash = hash;
    else this.#fromHash();
  }
  #fromHash() {
    const params = readHash();
    const encoding = params.get("encoding") === "json" ? "json" : "msgpack";
    const from = params.get("from") === "snapshot" ? "snapshot" : "start";
    const thread = (params.get("thread") ?? "").trim();
    const branch = (params.get("branch") ?? "").trim() || null;
    const raw = params.get("raw");
    this.#rawMode = raw === "hide" || raw === "full" ? raw : "short";
    this.#rawShown = -1;
    this.#schedule();
    this.#encoding.value = encoding;
    if (document.activeElement !== this.#threadInput || !this.#threadInput.value) {
      this.#threadInput.value = thread;
    }
    const changedClient = encoding !== this.connection.encoding;
    const changedThread = thread !== (this.connection.thread ?? "") || from !== this.connection.from || branch !== this.connection.branch;
    this.connection.encoding = encoding;
    this.connection.from = from;
    this.connection.branch = branch;
    if (!thread) {
      this.connection.thread = null;
      this.#closeSubscription();
      this.#closeClient();
      this.#runs = [];
      this.#renderBranches();
      this.#showEmpty();
      this.#setStatus("idle");
      return;
    }
    const problem = threadProblem(thread);
    if (problem) {
      this.#notify("error", problem);
      return;
    }
    if (!changedClient && !changedThread && this.#client) return;
    if (thread !== this.connection.thread) this.#runs = [];
    this.connection.thread = thread;
    document.title = `${thread} · agui-hub viewer`;
    rememberThread(thread);
    this.#fillRecent();
    if (changedClient || !this.#client) this.#connect();
    else this.#subscribe();
  }
  #fillRecent() {
    this.#recent.replaceChildren(
      ...recentThreads().map((thread) => {
        const option = el("option");
        option.value = thread;
        return option;
      })
    );
  }
  // -- connection ------------------------------------------------------------------------------------
  #connect() {
    if (!this.connection.thread || !this.connection.hub) return;
    this.#closeSubscription();
    this.#closeClient();
    const token = storage("session")?.getItem(tokenKey(this.connection.hub)) || void 0;
    try {
      this.#client = new HubClient({
        url: this.connection.hub,
        encoding: this.connection.encoding,
        token,
        client: CLIENT_INFO
      });
    } catch (error) {
      this.#notify("error", `cannot connect: ${error.message}`);
      return;
    }
    this.connection.reconnects = 0;
    this.connection.resumes = [];
    const client = this.#client;
    client.onStatus((status) => {
      if (client === this.#client) this.#onStatus(status);
    });
    this.#onStatus(client.status);
    this.#subscribe();
  }
  #closeClient() {
    const client = this.#client;
    this.#client = null;
    if (client) void client.close().catch(() => void 0);
  }
  #closeSubscription() {
    const sub = this.#sub;
    this.#sub = null;
    this.#generation += 1;
    this.#showPresence(null);
    if (sub) void sub.close().catch(() => void 0);
  }
  #subscribe() {
    const client = this.#client;
    const thread = this.connection.thread;
    if (!client || !thread) return;
    this.#closeSubscription();
    const generation = this.#generation;
    this.model.reset();
    this.#stateShown = void 0;
    this.connection.subscribed = false;
    const wasStopped = this.connection.stopped !== null;
    this.connection.stopped = null;
    if (wasStopped) this.#setStatus(this.connection.state);
    this.connection.resumes = [];
    this.connection.snapshots = 0;
    this.connection.trimmed = false;
    this.connection.items = 0;
    this.#notify(null);
    this.#showWaiting(thread);
    this.#forks = [];
    this.#starts.clear();
    this.#renderBranches();
    this.#askRuns(generation);
    try {
      this.#sub = client.subscribe(thread, {
        from: this.connection.from,
        ...this.connection.branch !== null ? { branch: this.connection.branch } : {},
        presence: true,
        onItem: (item) => {
          if (generation === this.#generation) this.#onItem(item);
        }
      });
      this.#sub.onPresence((presence) => {
        if (generation === this.#generation) this.#showPresence(presence);
      });
    } catch (error) {
      this.#notify("error", error.message);
      return;
    }
    this.#sub.onEnd((error) => {
      if (generation !== this.#generation || !error) return;
      this.connection.subscribed = false;
      this.#showPresence(null);
      this.connection.error = describe(error);
      this.connection.stopped = this.connection.error;
      this.#notify("error", this.connection.error);
      this.#setStatus(this.connection.state);
      if (error instanceof CommandRejected && error.code === "unauthorized") {
        byId("token-box").open = true;
        this.#token.focus();
      }
    });
    this.#schedule();
  }
  #onStatus(status) {
    const c = this.connection;
    c.attempt = status.attempt;
    c.reconnects = status.reconnects;
    c.closeCode = status.closeCode;
    c.closeReason = status.closeReason;
    c.error = status.error ? status.error.message : null;
    const state = status.state === "open" ? "live" : status.state;
    if (state === "closed" && status.error) {
      this.#notify("error", describe(status.error));
    } else if (state !== "live" && status.attempt >= 3) {
      const why = status.error?.message ?? `cannot connect to ${this.connection.hub}`;
      const token = storage("session")?.getItem(tokenKey(this.connection.hub)) ? " (is the token still valid?)" : "";
      this.#notify("error", `${why}${token}; retrying`, true);
    } else if (state === "live") {
      this.#clearConnectionNotice();
    }
    this.#setStatus(state);
  }
  #onItem(item) {
    const c = this.connection;
    c.items += 1;
    if (item.kind === "event") {
      this.model.apply(item.event);
      const type = item.event.type;
      if (type === "RUN_STARTED") this.#rememberStart(item.event);
      if (type === "RUN_STARTED" || type === "RUN_FINISHED" || type === "RUN_ERROR") {
        this.#askRuns(this.#generation);
      }
    } else if (item.kind === "snapshot") {
      c.snapshots += 1;
      if (!item.complete) c.trimmed = true;
      this.model.reset();
      this.#stateShown = void 0;
      this.model.applyAll(item.events);
      for (const event of item.events) {
        if (event.type === "RUN_STARTED") this.#rememberStart(event);
      }
    } else {
      c.subscribed = true;
      if (item.resumed) {
        c.resumes.push({ complete: item.recovered, at: Date.now() });
        this.#showResume();
      } else if (!item.recovered && c.items > 1) {
        this.#notify("info", "the thread was re-created: showing its new history");
      }
    }
    this.#schedule();
  }
  // -- branches --------------------------------------------------------------------------------------
  /** Ask for the thread's runs (at most one request at a time; the latest answer wins). */
  #askRuns(generation) {
    const client = this.#client;
    const thread = this.connection.thread;
    if (!client || !thread) return;
    const asked = ++this.#runsAsked;
    client.runs(thread).then(({ runs, agents }) => {
      if (generation !== this.#generation || asked !== this.#runsAsked) return;
      this.#runs = runs;
      this.#agents = agents;
      this.#renderBranches();
    }).catch(() => void 0);
  }
  /** "‹ 2 of 3 ›" for each place where the conversation shown has other versions, in the
   * transcript where they begin to differ. */
  #renderBranches() {
    const tip = this.#sub?.branch ?? this.connection.branch;
    this.#forks = this.connection.thread ? forksOf(this.#runs, tip ?? null) : [];
    const rows = new Map(
      this.#forks.map((fork) => {
        const row = el("div", "fork");
        row.dataset.testid = "fork";
        row.dataset.noText = "";
        row.setAttribute("role", "group");
        row.setAttribute("aria-label", "versions of the conversation");
        const go = (step) => {
          const target = fork.versions[(fork.index + step + fork.versions.length) % fork.versions.length];
          this.#setHash({ branch: target });
        };
        const previous = el("button", "fork-step", "‹");
        previous.type = "button";
        previous.title = "the previous version";
        previous.dataset.testid = "fork-previous";
        previous.addEventListener("click", () => go(-1));
        const next = el("button", "fork-step", "›");
        next.type = "button";
        next.title = "the next version";
        next.dataset.testid = "fork-next";
        next.addEventListener("click", () => go(1));
        const label = el("span", "fork-label", `${fork.index + 1} of ${fork.versions.length}`);
        const what = el("span", "fork-preview", fork.preview ? fork.preview : fork.run);
        what.title = `run ${fork.run}`;
        row.append(previous, label, next, what);
        return [fork.run, row];
      })
    );
    this.#view.setForks(rows);
    this.#renderActions();
  }
  #rememberStart(event) {
    if (typeof event.runId === "string") this.#starts.set(event.runId, event);
  }
  /** The latest run shown, and the question it answered (the last user message of its
   * input), when this page may run an agent from its parent: regenerate, edit. */
  #latest() {
    if (this.#agents.length === 0 || this.#runs.length === 0) return null;
    const tip = branchTip(this.#runs, this.#sub?.branch ?? this.connection.branch ?? null);
    const run = this.#runs.find((r) => r.runId === tip);
    if (!run || run.parentRunId === null || run.status === "running") return null;
    const question = this.#question(run.runId);
    return question ? { run, question } : null;
  }
  /** The question *run* answered: the last user message of its input, if that came. */
  #question(run) {
    const input = this.#starts.get(run)?.input;
    const messages = Array.isArray(input?.messages) ? input.messages : [];
    for (let i = messages.length - 1; i >= 0; i--) {
      const message = messages[i];
      if (message && message.role === "user") return message;
    }
    return null;
  }
  /** "regenerate" and "edit" for the latest run shown, when an agent may be run here. */
  #renderActions() {
    const latest = this.#latest();
    this.#actions.hidden = latest === null;
    if (latest === null) {
      this.#actions.replaceChildren();
      return;
    }
    const agent = this.#agents[0];
    const regenerate = el("button", "run-action", "regenerate");
    regenerate.type = "button";
    regenerate.dataset.testid = "regenerate";
    regenerate.title = `${agent} answers the last question again (a new version)`;
    regenerate.addEventListener("click", () => {
      void this.#runFrom(latest.run, [latest.question]);
    });
    const edit = el("button", "run-action", "edit");
    edit.type = "button";
    edit.dataset.testid = "edit";
    edit.title = `change the last question; ${agent} answers it (a new version)`;
    edit.addEventListener("click", () => {
      const before = typeof latest.question.content === "string" ? latest.question.content : "";
      const text = window.prompt("Edit the question", before);
      if (text === null || !text.trim()) return;
      const id = `edit-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
      void this.#runFrom(latest.run, [{ id, role: "user", content: text }]);
    });
    this.#actions.replaceChildren(regenerate, edit);
  }
  /** A new version of *run*: the agent runs from *run*'s parent with *messages*; the page
   * follows it once the hub lists it. */
  async #runFrom(run, messages) {
    const client = this.#client;
    const thread = this.connection.thread;
    if (!client || !thread || run.parentRunId === null) return;
    try {
      const reply = await client.run(thread, this.#agents[0], {
        parentRunId: run.parentRunId,
        messages
      });
      const runId = reply.runId;
      if (typeof runId !== "string") return;
      for (let tries = 0; tries < 50; tries++) {
        const { runs } = await client.runs(thread);
        if (runs.some((r) => r.runId === runId)) {
          this.#setHash({ branch: runId });
          return;
        }
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    } catch (error) {
      this.#notify("error", `the agent could not be run: ${describe(error)}`);
    }
  }
  // -- rendering --------------------------------------------------------------------------------------
  #schedule() {
    if (!this.#frame) this.#frame = requestAnimationFrame(() => this.#render());
  }
  #render() {
    if (this.#frame) cancelAnimationFrame(this.#frame);
    this.#frame = 0;
    this.#view.render(this.model);
    if (this.model.state !== this.#stateShown) {
      this.#stateShown = this.model.state;
      this.#state.render(this.model.state);
    }
    const problem = this.model.stateProblem;
    this.#stateProblem.hidden = !problem;
    this.#stateProblem.textContent = problem ? "could not apply an update" : "";
    this.#stateProblem.title = problem ?? "";
    const skipped = this.model.problemCount;
    const raw = this.model.rawCount;
    this.#eventsLine.textContent = `${this.model.eventCount} events` + (raw && this.#rawMode === "short" ? ` · ${raw} RAW/CUSTOM (${kilobytes(this.model.rawBytes)}) not shown` : "") + (skipped ? ` · ${skipped} could not be shown (${this.model.problems.at(-1)?.reason ?? ""})` : "") + (this.connection.trimmed ? " · the beginning of the thread was trimmed" : "");
    this.#renderRaw();
  }
  /** The latest RAW and CUSTOM events, whole, when the page is told to show them
   * (#raw=full): one line of JSON each, newest last. */
  #renderRaw() {
    const full = this.#rawMode === "full" && this.model.rawCount > 0;
    this.#rawPanel.hidden = !full;
    if (!full || this.#rawShown === this.model.rawCount) return;
    this.#rawShown = this.model.rawCount;
    const items = this.model.rawEvents.map((event) => {
      const item = document.createElement("li");
      item.textContent = safeJson(event);
      return item;
    });
    this.#rawList.replaceChildren(...items);
    const older = this.model.rawCount - this.model.rawEvents.length;
    byId("raw-head").textContent = `RAW and CUSTOM events: ${this.model.rawCount}` + (older ? ` (the latest ${items.length})` : "");
  }
  #setStatus(state) {
    const c = this.connection;
    c.state = state;
    const stopped = state === "live" && c.stopped !== null;
    this.#indicator.dataset.state = stopped ? "stopped" : state;
    let label = stopped ? "not following" : state;
    if (state === "reconnecting") label = `reconnecting (attempt ${Math.max(c.attempt, 1)})`;
    if (state === "connecting" && c.attempt > 1) label = `connecting (attempt ${c.attempt})`;
    if (state === "closed" && c.closeCode !== null) label = `closed (${c.closeCode})`;
    this.#status.textContent = label;
    this.#indicator.title = (stopped ? c.stopped : c.error) ?? c.closeReason ?? "";
    this.#reconnects.textContent = String(c.reconnects);
  }
  #showResume() {
    const last = this.connection.resumes.at(-1);
    if (!last) {
      this.#resume.textContent = "";
      return;
    }
    const resumes = this.connection.resumes;
    const complete = resumes.filter((r) => r.complete).length;
    this.#resume.title = `${resumes.length} resumes: ${complete} complete, ${resumes.length - complete} from a snapshot`;
    this.#resume.dataset.complete = String(last.complete);
    this.#resume.textContent = last.complete ? "resumed, nothing missed" : "resumed from a snapshot: events between were trimmed";
  }
  /** "N watching" in the header, who in its tooltip; hidden until the gateway sent the
   * list, and when it keeps no presence. */
  #showPresence(presence) {
    if (presence === null || !presence.known || presence.off) {
      this.#presence = { ...NO_PRESENCE, off: presence?.off ?? false };
      this.#watching.hidden = true;
      this.#watching.textContent = "";
      this.#watching.title = "";
      return;
    }
    const entries = presence.hidden ? [] : presence.entries;
    this.#presence = {
      shown: true,
      count: presence.count,
      subjects: entries.map((entry) => entry.subject),
      hidden: presence.hidden,
      off: false
    };
    this.#watching.hidden = false;
    this.#watching.textContent = `${presence.count} watching`;
    const lines = entries.map((entry) => watcherLine(entry, presence.self));
    const unlisted = presence.count - entries.length;
    if (presence.hidden) lines.push("this hub shows how many, not who");
    else if (unlisted > 0) lines.push(`and ${unlisted} more`);
    this.#watching.title = lines.join("\n");
  }
  #showWaiting(thread) {
    this.#resume.textContent = "";
    const code = el("code", void 0, thread);
    this.#view.setEmptyText(["Waiting for events on ", code, "…"]);
  }
  #showEmpty() {
    const link = el("a");
    link.href = "#thread=demo";
    link.append(el("code", void 0, "#thread=demo"));
    this.model.reset();
    this.#stateShown = void 0;
    this.#view.setEmptyText([
      "Type a thread id above to follow it. To see one stream, run ",
      el("code", void 0, "agui-hub demo demo"),
      " and open ",
      link,
      "."
    ]);
    this.#schedule();
  }
  #connectionNotice = false;
  #notify(kind, text = "", aboutConnection = false) {
    this.#notice.hidden = kind === null;
    this.#notice.dataset.kind = kind ?? "";
    this.#notice.textContent = text;
    this.#connectionNotice = aboutConnection;
  }
  #clearConnectionNotice() {
    if (this.#connectionNotice) this.#notify(null);
  }
};
function describe(error) {
  if (error instanceof ConnectionRejected) {
    const what = error.closeCode === 4401 ? "the token was refused" : "the gateway refused the connection";
    return `${what} (${error.closeCode}): ${error.message}`;
  }
  if (error instanceof CommandRejected) {
    if (error.code === "unauthorized") return `this gateway wants a token (under Token): ${error.message}`;
    if (error.code === "forbidden") return `not allowed to read this thread: ${error.message}`;
    return error.message.startsWith(error.code) ? error.message : `${error.code}: ${error.message}`;
  }
  if (error instanceof HubError) return error.message;
  return String(error);
}
function start() {
  const viewer = new Viewer();
  window.aguiViewer = {
    model: () => viewer.snapshot(),
    transcriptText: () => viewer.transcriptText()
  };
}
if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
else start();
