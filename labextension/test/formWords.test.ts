import { COUNT_DEFAULTS, countDefault, fieldOfFailure, inFormWords } from '../src/formWords';
import { INewSession, checkForm } from '../src/sessionRequest';

const form = (extra: Partial<INewSession> = {}): INewSession => ({
  name: 'train', launcher: 'ray', hosts: '', nodes: '2', kind: 'procs', count: '1', backend: '', ...extra
});

describe("the server's messages in the form's words", () => {
  it('lose the flag of the field they are under, keeping its value', () => {
    expect(inFormWords('ray: --ray-cpus 5000: expected 1 to 4096', 'rayCpus')).toBe("'5000': expected 1 to 4096");
    expect(inFormWords('--procs 0: expected a whole number, 1 or more', 'count')).toBe(
      "'0': expected a whole number, 1 or more"
    );
    expect(inFormWords("k8s: --pod-template '/srv/p.yaml': No such file or directory", 'k8sPodTemplate')).toBe(
      "'/srv/p.yaml': No such file or directory"
    );
  });

  it('name the other fields and the launchers as the form does, never as flags', () => {
    const text = inFormWords(
      '--ray: say how many ranks each node runs: --gpus G (one per GPU) or --procs P (CPU ranks)',
      'count'
    );
    expect(text).toBe(
      'the Ray cluster launcher: say how many ranks each node runs: the "Count" field G (one per GPU) or the "Count" field P (CPU ranks)'
    );
    expect(text).not.toMatch(/--[a-z]/);
    expect(inFormWords("--nodes 3 but 2 hosts are given (a,b); drop --nodes", 'nodes')).toBe(
      '\'3\' but 2 hosts are given (a,b); drop the "Nodes" field'
    );
    // what the form has no field for stays as written
    expect(inFormWords('port 6379 unless it was given another --port', 'form')).toBe(
      'port 6379 unless it was given another --port'
    );
  });

  it('say a Ray address where no cluster answered under "Ray address", with its origin if it is not the field', () => {
    const typed =
      'Ray address 127.0.0.1:9 (given by --ray-address): no Ray cluster answered there within 6 s. ' +
      'Expected the GCS address of a running cluster\'s head, HOST:PORT';
    expect(fieldOfFailure(typed)).toBe('rayAddress');
    expect(inFormWords(typed, 'rayAddress')).toBe(
      "'127.0.0.1:9': no Ray cluster answered there within 6 s. Expected the GCS address of a running cluster's head, HOST:PORT"
    );
    const fromEnv = 'Ray address 10.0.0.1:6379 (from the RAY_ADDRESS environment variable): no Ray cluster answered';
    expect(inFormWords(fromEnv, 'rayAddress')).toBe(
      "'10.0.0.1:6379' (from the RAY_ADDRESS environment variable): no Ray cluster answered"
    );
    const k8s = "Kubernetes API server https://10.0.0.9:6443 (context 'a' of the kubeconfig /k, given by --context): no answer within 5 s";
    expect(fieldOfFailure(k8s)).toBe('k8sContext');
    expect(inFormWords(k8s, 'k8sContext')).toBe(
      "'https://10.0.0.9:6443' (context 'a' of the kubeconfig /k, given by the \"Context\" field): no answer within 5 s"
    );
    expect(fieldOfFailure('Ray: cannot place 2 bundles')).toBeNull();
  });
});

describe('Count', () => {
  it('has a real default for every launcher', () => {
    expect(Object.keys(COUNT_DEFAULTS).sort()).toEqual(['k8s', 'local', 'ray', 'slurm', 'ssh']);
    for (const launcher of Object.keys(COUNT_DEFAULTS)) {
      expect(countDefault(launcher)).toMatch(/^[1-9]\d*$/);
    }
    expect(countDefault('local')).toBe('2');
    expect(countDefault('ray')).toBe('1');
    expect(countDefault('k8s')).toBe('1');
  });

  it('left empty for a cluster launcher is marked at Count in words', () => {
    expect(checkForm(form({ count: '' })).count).toBe(
      'expected the number of processes each node runs (1, or one per node: 4,2): Ray has no default'
    );
    expect(checkForm(form({ launcher: 'k8s', kind: 'gpus', count: '' })).count).toMatch(/GPUs each node runs.*Kubernetes has no default/);
    expect(checkForm(form({ launcher: 'local', nodes: '', count: '' }))).toEqual({});
  });
});
